//! The student side of the Student DB: the transaction that writes a student together with
//! the effect its creation decides, and the reads behind GetStudent and ListStudents.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use platform::{
    db::{begin_write, insert_both, is_database_error},
    failpoint,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction,
    DbBackend, DbErr, DeleteMany, EntityTrait, NotSet, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait, Set, Statement, TryIntoModel,
    sea_query::{LockBehavior, LockType},
};
use uuid::Uuid;

use crate::{
    effect::{CREATE_USER, CreateUserPayload, DisableUserPayload, Effect, UpdateUserPayload},
    entity::{
        outbox::{self, OutboxStatus},
        students, unchanged_keys,
    },
    wake::RelayBell,
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
    /// The call's W3C trace context, stored on the outbox row.
    pub traceparent: String,
}

/// Writes a student and its `create-user` outbox row in ONE transaction (see
/// [`create_many`], which this is for one student).
pub async fn create(
    db: &DatabaseConnection,
    bell: &RelayBell,
    new: NewStudentRow,
) -> Result<StudentView, DbErr> {
    let mut views = create_many(db, bell, vec![new]).await?;
    views.pop().ok_or(DbErr::RecordNotInserted)
}

/// Writes each of `news`, a student and its `create-user` outbox row, in ONE transaction:
/// on PostgreSQL one statement (see [`insert_together`]), elsewhere, or with the `NOTIFY`
/// inside, an explicit transaction. Returns the students in the order given.
///
/// All rows commit or none does: once this returns, the intention to create each login
/// user is on disk and the relay will deliver it, whatever crashes afterwards. A unique
/// violation (a client key, or a document number) fails them all and is returned as the
/// database error for the caller to tell apart (see [`create_each`]).
pub async fn create_many(
    db: &DatabaseConnection,
    bell: &RelayBell,
    news: Vec<NewStudentRow>,
) -> Result<Vec<StudentView>, DbErr> {
    let backend = db.get_database_backend();
    let rows: Vec<_> = news.into_iter().map(|new| new_rows(backend, new)).collect();
    let group = rows.len() > 1;
    let written = if backend == DbBackend::Postgres && !bell.rings_in_transaction() {
        // Crash point: nothing is sent yet. The statement below is its own transaction, so
        // there is no moment, committed or not, with some rows and not the others.
        failpoint::hit(failpoint::points::STUDENT_BEFORE_COMMIT).await;
        if group {
            failpoint::hit(failpoint::points::STUDENT_BEFORE_GROUP_COMMIT).await;
        }
        insert_together(db, rows).await?
    } else {
        let txn = begin_write(db).await?;
        let mut written = Vec::with_capacity(rows.len());
        for (student, create_user) in rows {
            let student = student.insert(&txn).await?;
            let create_user = create_user.insert(&txn).await?;
            written.push((student, create_user));
        }
        bell.in_transaction(&txn).await?;
        failpoint::hit(failpoint::points::STUDENT_BEFORE_COMMIT).await;
        if group {
            failpoint::hit(failpoint::points::STUDENT_BEFORE_GROUP_COMMIT).await;
        }
        // Crash point: before this commit nothing exists; after it, every row does.
        txn.commit().await?;
        written
    };
    bell.after_commit();
    failpoint::hit(failpoint::points::STUDENT_AFTER_COMMIT).await;
    Ok(written
        .into_iter()
        .map(|(student, create_user)| StudentView {
            student,
            create_user: Some(create_user),
        })
        .collect())
}

/// Writes each of `news` and gives back each one's own outcome, in order: all in one
/// transaction ([`create_many`]) when they can be; when the database refuses that one (a
/// unique violation, which does not say whose row broke it; a deadlock), nothing was
/// written, and each is written on its own so that each gets the answer it would have got
/// alone. An error with
/// no answer from the database (a lost connection) is every student's.
///
/// This is what CreateStudent's group commit runs (student-svc `writer.rs`): students
/// asked for while one transaction commits are written together in the next.
pub async fn create_each(
    db: &DatabaseConnection,
    bell: &RelayBell,
    news: Vec<NewStudentRow>,
) -> (CommitPath, Vec<Result<StudentView, DbErr>>) {
    let news = match <[NewStudentRow; 1]>::try_from(news) {
        Ok([new]) => return (CommitPath::Alone, vec![create(db, bell, new).await]),
        Err(news) => news,
    };
    let err = match create_many(db, bell, news.clone()).await {
        Ok(views) => return (CommitPath::Together, views.into_iter().map(Ok).collect()),
        Err(err) => err,
    };
    if !is_database_error(&err) {
        let message = err.to_string();
        let outcomes = news
            .iter()
            .map(|_| Err(DbErr::Custom(message.clone())))
            .collect();
        return (CommitPath::Together, outcomes);
    }
    let outcomes = news.into_iter().map(|new| create(db, bell, new));
    (CommitPath::Each, join_all(outcomes).await)
}

/// How [`create_each`] wrote its students.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPath {
    /// One student, one transaction.
    Alone,
    /// Several in one transaction.
    Together,
    /// Several, each in its own transaction, after the shared one was refused.
    Each,
}

impl CommitPath {
    /// The name metrics give this path.
    pub fn label(self) -> &'static str {
        match self {
            Self::Alone => "alone",
            Self::Together => "together",
            Self::Each => "each",
        }
    }
}

/// The two rows CreateStudent writes: the student, and the outbox row that creates its
/// login user.
fn new_rows(
    backend: DbBackend,
    new: NewStudentRow,
) -> (students::ActiveModel, outbox::ActiveModel) {
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
    let available_at = match backend {
        DbBackend::Postgres => NotSet,
        _ => Set(new.created_at),
    };

    // The caller's key goes on the outbox row too: the outbox's unique index on client keys
    // then covers every Student RPC, so a key already used by a change (or a change racing
    // for this key) is a unique violation here, not a second operation.
    let client = new
        .client_key
        .clone()
        .map(|key| (key, new.request_hash.clone()));
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
        version: Set(1),
        synced_version: Set(0),
        active: Set(true),
    };
    let create_user = outbox_row(
        new.id,
        1,
        &effect,
        client,
        (new.created_at, available_at),
        new.traceparent,
    );
    (student, create_user)
}

/// The statement CreateStudent runs on PostgreSQL for `news` (with the relays woken after
/// the commit, the default), for the test that holds `bench/pgbench/create_student.sql` to
/// it (one student; a group adds a `VALUES` row per student).
pub fn create_statement(news: Vec<NewStudentRow>) -> Statement {
    let rows = news
        .into_iter()
        .map(|new| new_rows(DbBackend::Postgres, new))
        .collect();
    together(rows)
}

/// PostgreSQL: the students and their outbox rows in ONE statement (see
/// [`insert_together`]), returning the outbox rows.
fn together(rows: Vec<(students::ActiveModel, outbox::ActiveModel)>) -> Statement {
    let (students, create_users): (Vec<_>, Vec<_>) = rows.into_iter().unzip();
    let mut statement = insert_both(
        students::Entity::insert_many(students).into_query(),
        outbox::Entity::insert_many(create_users).into_query(),
    );
    statement.returning_all();
    DbBackend::Postgres.build(&statement)
}

/// PostgreSQL: the students and their outbox rows in ONE statement (see
/// [`platform::db::insert_both`]), one round trip instead of four, which made CreateStudent
/// a third faster (BENCHMARKS-JOURNAL.md, "CreateStudent in one statement"). Returns them in
/// the order of `rows`.
async fn insert_together(
    db: &DatabaseConnection,
    rows: Vec<(students::ActiveModel, outbox::ActiveModel)>,
) -> Result<Vec<(students::Model, outbox::Model)>, DbErr> {
    let written = rows
        .iter()
        .map(|(student, _)| student.clone().try_into_model())
        .collect::<Result<Vec<_>, _>>()?;
    let mut outbox_rows: HashMap<Uuid, outbox::Model> = outbox::Entity::find()
        .from_raw_sql(together(rows))
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.aggregate_id, row))
        .collect();
    written
        .into_iter()
        .map(|student| {
            let row = outbox_rows
                .remove(&student.id)
                .ok_or(DbErr::RecordNotInserted)?;
            Ok((student, row))
        })
        .collect()
}

/// Writes a student already linked to `user_id`, with no outbox row: the naive flow of
/// student-svc's `--link-mode direct`, which called Users itself before saving the
/// student. Kept as a benchmark baseline; see `student-svc/src/direct.rs` for its flaw.
pub async fn create_linked(
    db: &DatabaseConnection,
    new: NewStudentRow,
    user_id: Uuid,
) -> Result<StudentView, DbErr> {
    let student = students::ActiveModel {
        id: Set(new.id),
        first_name: Set(new.first_name),
        last_name: Set(new.last_name),
        email: Set(new.email),
        document_number: Set(new.document_number),
        user_id: Set(Some(user_id)),
        client_key: Set(new.client_key),
        request_hash: Set(new.request_hash),
        created_at: Set(new.created_at),
        updated_at: Set(new.created_at),
        version: Set(1),
        synced_version: Set(1),
        active: Set(true),
    }
    .insert(db)
    .await?;
    Ok(StudentView {
        student,
        create_user: None,
    })
}

/// A new `pending` outbox row for `effect`, carrying the student's `version`.
fn outbox_row(
    student_id: Uuid,
    version: i64,
    effect: &Effect,
    client: Option<(String, String)>,
    (created_at, available_at): (DateTime<Utc>, sea_orm::ActiveValue<DateTime<Utc>>),
    traceparent: String,
) -> outbox::ActiveModel {
    let (client_key, request_hash) = client.unzip();
    outbox::ActiveModel {
        aggregate_id: Set(student_id),
        aggregate_version: Set(version),
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
        created_at: Set(created_at),
        processed_at: Set(None),
        result: Set(None),
        failure_kind: Set(None),
        client_key: Set(client_key),
        request_hash: Set(request_hash),
        traceparent: Set(Some(traceparent)),
        ..Default::default()
    }
}

/// A change to an existing student.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// New names and e-mail (the document number never changes).
    Update {
        first_name: String,
        last_name: String,
        email: String,
    },
    Deactivate,
}

/// A change as asked for, validated by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRequest {
    pub student_id: Uuid,
    pub change: Change,
    /// Apply only to this version (optimistic concurrency), when given.
    pub expected_version: Option<i64>,
    /// The caller's key and the request's fingerprint, stored on the outbox row.
    pub client: Option<(String, String)>,
    pub at: DateTime<Utc>,
    /// The call's W3C trace context, stored on the outbox row.
    pub traceparent: String,
}

/// What became of a change.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeOutcome {
    /// Accepted: the student's new version and its outbox row are committed.
    Changed(StudentView),
    /// It would change nothing (the same values, or deactivating an inactive student): no
    /// version spent, no outbox row; only the caller's key, if it sent one.
    Unchanged(StudentView),
}

/// Why a change was refused. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("student {0} not found")]
    NotFound(Uuid),
    #[error("the student is at version {current}, not {expected}")]
    VersionMismatch { expected: i64, current: i64 },
    #[error("the student is inactive")]
    Inactive,
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// Applies a change to a student and writes the effect it decides (`update-user` or
/// `disable-user`, carrying the student's new version) in ONE transaction.
///
/// The student row is locked for the transaction (`FOR UPDATE` on PostgreSQL, the write
/// lock on SQLite), so concurrent changes of one student are applied one after the other,
/// each with its own version; that is also what orders the student's outbox rows.
pub async fn change(
    db: &DatabaseConnection,
    bell: &RelayBell,
    request: ChangeRequest,
) -> Result<ChangeOutcome, ChangeError> {
    let txn = begin_write(db).await?;
    let student = students::Entity::find_by_id(request.student_id)
        .lock_exclusive()
        .one(&txn)
        .await?
        .ok_or(ChangeError::NotFound(request.student_id))?;
    if let Some(expected) = request.expected_version
        && expected != student.version
    {
        return Err(ChangeError::VersionMismatch {
            expected,
            current: student.version,
        });
    }
    let version = student.version + 1;
    let (changed, effect) = match &request.change {
        Change::Deactivate if !student.active => {
            return unchanged(txn, db, student, request.client, request.at).await;
        }
        Change::Update { .. } if !student.active => return Err(ChangeError::Inactive),
        Change::Update {
            first_name,
            last_name,
            email,
        } => {
            if (first_name, last_name, email)
                == (&student.first_name, &student.last_name, &student.email)
            {
                return unchanged(txn, db, student, request.client, request.at).await;
            }
            let effect = Effect::UpdateUser(UpdateUserPayload {
                version: UpdateUserPayload::VERSION,
                student_id: student.id,
                first_name: first_name.clone(),
                last_name: last_name.clone(),
                email: email.clone(),
                source_version: u64::try_from(version).unwrap_or_default(),
            });
            let changed = students::ActiveModel {
                first_name: Set(first_name.clone()),
                last_name: Set(last_name.clone()),
                email: Set(email.clone()),
                ..Default::default()
            };
            (changed, effect)
        }
        Change::Deactivate => {
            let effect = Effect::DisableUser(DisableUserPayload {
                version: DisableUserPayload::VERSION,
                student_id: student.id,
                source_version: u64::try_from(version).unwrap_or_default(),
            });
            let changed = students::ActiveModel {
                active: Set(false),
                ..Default::default()
            };
            (changed, effect)
        }
    };
    let student = students::ActiveModel {
        id: Set(student.id),
        version: Set(version),
        updated_at: Set(request.at),
        ..changed
    }
    .update(&txn)
    .await?;
    let available_at = match db.get_database_backend() {
        DbBackend::Postgres => NotSet,
        _ => Set(request.at),
    };
    outbox_row(
        student.id,
        version,
        &effect,
        request.client,
        (request.at, available_at),
        request.traceparent,
    )
    .insert(&txn)
    .await?;
    bell.in_transaction(&txn).await?;
    // Crash point: before this commit neither the new version nor its effect exists; after
    // it, both do, and the relay will deliver the effect after every earlier one.
    failpoint::hit(failpoint::points::STUDENT_CHANGE_BEFORE_COMMIT).await;
    txn.commit().await?;
    bell.after_commit();
    Ok(ChangeOutcome::Changed(with_create_user(db, student).await?))
}

/// Ends a change that changes nothing: no version spent, no outbox row. Its client key, if
/// the caller sent one, is kept all the same (in `unchanged_keys`, committed while the
/// student's row is still locked), so that a retry is answered as a retry: were it judged
/// afresh after another client's change, it would apply its values over the newer ones.
async fn unchanged(
    txn: DatabaseTransaction,
    db: &DatabaseConnection,
    student: students::Model,
    client: Option<(String, String)>,
    at: DateTime<Utc>,
) -> Result<ChangeOutcome, ChangeError> {
    match client {
        Some((client_key, request_hash)) => {
            unchanged_keys::ActiveModel {
                client_key: Set(client_key),
                student_id: Set(student.id),
                request_hash: Set(request_hash),
                created_at: Set(at),
            }
            .insert(&txn)
            .await?;
            txn.commit().await?;
        }
        // Nothing to keep: rolled back, the lock released.
        None => drop(txn),
    }
    Ok(ChangeOutcome::Unchanged(
        with_create_user(db, student).await?,
    ))
}

/// What a caller's UpdateStudent or DeactivateStudent key decided: each record of it, its
/// student and the fingerprint of the request. A change's key lives on its outbox row, the
/// key of one that changed nothing in `unchanged_keys`; empty when the key decided nothing.
///
/// Usually one record, but the two are separate unique indexes, so a key can be found in
/// both: sent by two different requests racing, or first by a change that changed nothing
/// and then by a CreateStudent (whose outbox row carries its key, and which does not read
/// `unchanged_keys`). Each call did its one operation once; a retry is recognised by any
/// record that matches it.
pub async fn find_changes_by_client_key(
    db: &DatabaseConnection,
    client_key: &str,
) -> Result<Vec<(Uuid, Option<String>)>, DbErr> {
    let mut records: Vec<(Uuid, Option<String>)> = outbox::Entity::find()
        .filter(outbox::Column::ClientKey.eq(client_key))
        .all(db)
        .await?
        .into_iter()
        .map(|row| (row.aggregate_id, row.request_hash))
        .collect();
    let unchanged = unchanged_keys::Entity::find_by_id(client_key)
        .one(db)
        .await?;
    records.extend(unchanged.map(|key| (key.student_id, Some(key.request_hash))));
    Ok(records)
}

/// Deletes the keys of changes that changed nothing kept longer than `retention` (`relay
/// purge`'s `--retain-done`, as for a change's key on its `done` outbox row), oldest first,
/// in batches of one short statement each; returns how many were deleted.
pub async fn purge_unchanged_keys(
    db: &DatabaseConnection,
    retention: std::time::Duration,
) -> Result<u64, DbErr> {
    platform::retention::purge_older_than(db, retention, purge_unchanged_keys_batch).await
}

/// One batch of [`purge_unchanged_keys`]: the `batch` oldest keys kept since before
/// `horizon`, found through `unchanged_keys_created_at`. On PostgreSQL it skips keys
/// another purge has locked, so relays purging at once never wait on each other.
pub fn purge_unchanged_keys_batch(
    backend: DbBackend,
    horizon: DateTime<Utc>,
    batch: u64,
) -> DeleteMany<unchanged_keys::Entity> {
    let mut oldest = unchanged_keys::Entity::find()
        .select_only()
        .column(unchanged_keys::Column::ClientKey)
        .filter(unchanged_keys::Column::CreatedAt.lt(horizon))
        .order_by_asc(unchanged_keys::Column::CreatedAt)
        .limit(batch)
        .into_query();
    if backend == DbBackend::Postgres {
        oldest.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    }
    unchanged_keys::Entity::delete_many().filter(platform::retention::batch_of(
        unchanged_keys::Column::ClientKey,
        oldest,
        backend,
    ))
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

/// The user student `id` is linked to: `None` while it has none, or if it does not exist.
/// A change of the student goes to this user (`relay` names it in UpdateUser and
/// DisableUser), since Users may hold several users for one student.
pub async fn linked_user(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<Uuid>, DbErr> {
    let linked: Option<Option<Uuid>> = students::Entity::find_by_id(id)
        .select_only()
        .column(students::Column::UserId)
        .into_tuple()
        .one(db)
        .await?;
    Ok(linked.flatten())
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
