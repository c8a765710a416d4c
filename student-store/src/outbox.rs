//! The outbox as the relay works it: claims, the state changes that end a delivery, the
//! operator's redrive, and the reads behind `relay status`, `replay` and `retry-failed`.
//! Each write is one statement or one short transaction, opened and committed here; none is
//! ever held open across a call to Users.
//!
//! Lease and backoff times come from one clock: on PostgreSQL the database's `now()`, so
//! relays on machines with skewed clocks agree; on SQLite (one machine) the application's,
//! bound as values in the stored format, never compared with SQLite's own time functions.
//!
//! Every write that ends a delivery is *fenced* by the claim it came from: it applies only
//! while the row is still `processing` under that claim (same relay, same attempt, same
//! idempotency key), and reports whether it did. A relay whose lease ran out, or whose row
//! was failed or re-keyed meanwhile, changes nothing.

use std::{
    collections::{HashMap, HashSet},
    sync::LazyLock,
    time::Duration,
};

use chrono::{DateTime, Utc};
use platform::db::{begin_write, now, shared_now};
use sea_orm::{
    ActiveEnum as _, ColumnTrait, Condition, ConnectionTrait as _, DatabaseConnection, DbBackend,
    DbErr, DeleteMany, EntityTrait, IdenStatic as _, Iterable as _, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect, QueryTrait as _, Select, Statement, TransactionTrait as _, UpdateMany,
    sea_query::{Expr, ExprTrait, LockBehavior, LockType},
};
use uuid::Uuid;

use crate::{
    effect::Effect,
    entity::{
        outbox::{self, FailureKind, OutboxStatus},
        students,
    },
    finish_many::{self, Finish},
};

/// Why an attempt did not succeed: a stable reason and a readable message, stored apart
/// (`error_code`, `last_error`) so that nobody ever parses one out of the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `DOCUMENT_NUMBER_TAKEN`, `UNAVAILABLE`, `LINK_CONFLICT`, …
    pub code: String,
    /// What happened, for people. Never personal data, never transport internals a client
    /// could act on wrongly.
    pub message: String,
}

impl Problem {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// Claims up to `limit` due rows for `relay_id`, oldest first, in ONE statement: rows that
/// are `pending` and past their backoff, or `processing` under a lease that has run out
/// (their relay died or stalled). Each claimed row becomes `processing`, leased to this
/// relay until now + `lease`, with one more attempt counted.
///
/// PostgreSQL: `FOR UPDATE SKIP LOCKED`, so concurrent relays never claim the same due row.
/// SQLite: the UPDATE runs under SQLite's single write lock, so it is just as exclusive.
pub async fn claim_batch(
    db: &DatabaseConnection,
    relay_id: &str,
    limit: u32,
    lease: Duration,
) -> Result<Vec<outbox::Model>, DbErr> {
    let statement = claim_statement(db.get_database_backend(), relay_id, limit, lease);
    // One statement, so one round trip and its own transaction.
    let mut rows = outbox::Entity::find()
        .from_raw_sql(statement)
        .all(db)
        .await?;
    // RETURNING does not promise an order.
    rows.sort_by_key(|row| row.id);
    Ok(rows)
}

/// The one statement [`claim_batch`] runs, with its values bound (for `EXPLAIN` too).
pub fn claim_statement(
    backend: DbBackend,
    relay_id: &str,
    limit: u32,
    lease: Duration,
) -> Statement {
    match backend {
        // The limit is written into the statement, not bound: PostgreSQL switches a
        // prepared statement to a generic plan after five runs, and a generic plan that
        // cannot see the limit plans for a tenth of the table (seconds per claim once the
        // outbox is large). With the limit in the text, the generic plan is the claim's
        // own; each limit is its own prepared statement.
        DbBackend::Postgres => Statement::from_sql_and_values(
            backend,
            CLAIM_POSTGRES.replace(LIMIT, &limit.to_string()),
            [relay_id.into(), millis(lease).into()],
        ),
        _ => {
            let at = now();
            let until = at + lease;
            Statement::from_sql_and_values(
                backend,
                CLAIM_SQLITE.as_str(),
                [
                    relay_id.into(),
                    until.into(),
                    at.into(),
                    at.into(),
                    i64::from(limit).into(),
                ],
            )
        }
    }
}

/// What Users did for a delivered row, as recorded on the student.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// `create-user`: Users created this user for the student (now, or before, answering
    /// from its inbox). It is linked to the student.
    UserCreated(Uuid),
    /// `update-user`, `disable-user`: the student's user reflects the change (or a newer
    /// one). It must be the user the student is linked to.
    UserChanged(Uuid),
}

impl Delivered {
    /// What delivering `effect` did, given the user Users answered with.
    pub fn of(effect: &Effect, user_id: Uuid) -> Self {
        match effect {
            Effect::CreateUser(_) => Self::UserCreated(user_id),
            Effect::UpdateUser(_) | Effect::DisableUser(_) => Self::UserChanged(user_id),
        }
    }

    /// The user Users answered with.
    pub fn user_id(self) -> Uuid {
        match self {
            Self::UserCreated(id) | Self::UserChanged(id) => id,
        }
    }
}

/// Why a delivery could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The row is no longer held by the claim the delivery came from: another relay
    /// claimed it after this one's lease ran out, or it was failed or re-keyed. Nothing was
    /// written; whoever holds the row now records its own outcome.
    #[error("outbox row {0} is no longer held by this claim; nothing recorded")]
    ClaimLost(i64),
    /// The student is linked to another user than the one Users answered with: never
    /// overwritten, always reported.
    #[error("student {student_id} is already linked to user {linked}, not {returned}")]
    LinkConflict {
        student_id: Uuid,
        linked: Uuid,
        returned: Uuid,
    },
    /// Users changed a user for a student that is not linked to any.
    #[error("student {student_id} is not linked to a user; Users changed user {returned}")]
    NotLinked { student_id: Uuid, returned: Uuid },
    #[error("student {0} does not exist")]
    StudentMissing(Uuid),
    #[error(transparent)]
    Db(#[from] DbErr),
}

impl RecordError {
    /// The stable reason of each error: the first three are what a row fails with when its
    /// delivery cannot be recorded (the relay records it in `error_code`); the last two
    /// fail no row (the row is someone else's now, or is claimed again after its lease).
    pub fn code(&self) -> &'static str {
        match self {
            Self::LinkConflict { .. } => "LINK_CONFLICT",
            // The reason a change row also gets when it finds no link before its call.
            Self::NotLinked { .. } => "NOT_LINKED",
            Self::StudentMissing(_) => "STUDENT_MISSING",
            Self::ClaimLost(_) => "CLAIM_LOST",
            Self::Db(_) => "DATABASE",
        }
    }
}

/// Records a delivery and marks the row `done`, in ONE transaction: for `create-user` the
/// returned user is linked to the student; for every effect the student's `synced_version`
/// rises to the row's version. Either the student shows it and the row is finished, or
/// neither.
///
/// Only while `relay_id` still holds the row under the claim `row` came from (fenced by
/// relay, attempt and key): a relay that finishes after its lease ran out and another relay
/// took the row gets [`RecordError::ClaimLost`] and changes nothing; the other relay got the
/// same answer from Users' inbox and records it. A *different* user than the one already
/// linked is refused, never written.
pub async fn record_delivery(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    delivered: Delivered,
) -> Result<(), RecordError> {
    let finish = held_by_claim(mark_done(delivered.user_id()), row, relay_id);
    finish_delivery(db, row, finish, delivered).await
}

/// The statements a group commit of `deliveries` runs when every row is still held (see
/// `finish_many`): on PostgreSQL one; on SQLite the rows become `done`, then their
/// students are linked. For the test that holds `bench/pgbench/link.sql` to them.
pub fn record_statements(
    backend: DbBackend,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Vec<Statement> {
    if backend == DbBackend::Postgres {
        return vec![finish_many::one_statement(relay_id, deliveries)];
    }
    let held: Vec<_> = deliveries.iter().collect();
    vec![
        finish_many::done_statement(backend, relay_id, deliveries),
        finish_many::link_statement(backend, &held),
    ]
}

/// What [`record_deliveries`] did: each row's result, in order, and how it got there.
#[derive(Debug)]
pub struct Recorded {
    pub results: Vec<Result<(), RecordError>>,
    pub path: BatchPath,
}

/// How [`record_deliveries`] recorded a batch (the relay counts them: a batch should
/// rarely go row by row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPath {
    /// One row, in a transaction of its own (on PostgreSQL, one statement).
    Alone,
    /// Set-based for the whole batch: one statement on PostgreSQL, two in a transaction
    /// on SQLite.
    Set,
    /// Row by row: a student refused its user, or two rows shared a student (each row in a
    /// savepoint of its own; on PostgreSQL only the refused rows, each alone, after the
    /// statement finished the others).
    RowByRow,
}

impl BatchPath {
    pub fn label(self) -> &'static str {
        match self {
            Self::Alone => "alone",
            Self::Set => "set",
            Self::RowByRow => "row_by_row",
        }
    }
}

/// Records several deliveries as [`record_delivery`] does, in ONE transaction: one commit
/// (one disk sync) for all of them instead of one each. A row that cannot be recorded (its
/// claim lost, a link conflict) changes nothing while the others commit. Returns each
/// row's result, in order; an error of the transaction itself records none. (On
/// PostgreSQL a row whose student refused its user is looked at again alone, after the
/// others committed.)
///
/// Set-based statements record the whole batch ([`crate::finish_many`]): on PostgreSQL one,
/// which is its own transaction; on SQLite two, which roll back when a student refuses its
/// user, and the batch is then recorded row by row, each in a savepoint of its own (as is
/// a batch in which two rows share a student, on both).
pub async fn record_deliveries(
    db: &DatabaseConnection,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Result<Recorded, DbErr> {
    let students: HashSet<Uuid> = deliveries.iter().map(|(row, _)| row.aggregate_id).collect();
    let one_per_student = students.len() == deliveries.len();
    if db.get_database_backend() == DbBackend::Postgres && one_per_student {
        return record_in_one_statement(db, relay_id, deliveries).await;
    }
    // A lone row needs no savepoint: its transaction is its own (two round trips fewer,
    // which is what a lightly loaded relay records).
    if let [(row, delivered)] = deliveries {
        return match record_delivery(db, row, relay_id, *delivered).await {
            Err(RecordError::Db(err)) => Err(err),
            result => Ok(Recorded {
                results: vec![result],
                path: BatchPath::Alone,
            }),
        };
    }
    // SQLite: the whole batch in two statements, when no two rows share a student (see
    // `finish_many`).
    if one_per_student {
        let txn = begin_write(db).await?;
        match finish_many::finish_all(&txn, relay_id, deliveries).await? {
            Some(results) => {
                // Crash point: before this commit every row is still leased and will be
                // delivered again, Users answering from its inbox; after it, every row
                // recorded is done and its student linked.
                txn.commit().await?;
                return Ok(Recorded {
                    results,
                    path: BatchPath::Set,
                });
            }
            // A student refused its user: undone, and recorded row by row to find which.
            None => txn.rollback().await?,
        }
    }
    let txn = begin_write(db).await?;
    let mut results = Vec::with_capacity(deliveries.len());
    for (row, delivered) in deliveries {
        let savepoint = txn.begin().await?;
        let finish = held_by_claim(mark_done(delivered.user_id()), row, relay_id);
        let result = match apply_delivery(&savepoint, row, finish, *delivered).await {
            Ok(()) => savepoint.commit().await.map_err(RecordError::from),
            Err(err) => {
                savepoint.rollback().await?;
                Err(err)
            }
        };
        if let Err(RecordError::Db(err)) = result {
            return Err(err);
        }
        results.push(result);
    }
    // Crash point: before this commit every row is still leased and will be delivered
    // again, Users answering from its inbox; after it, every recorded row is done.
    txn.commit().await?;
    Ok(Recorded {
        results,
        path: BatchPath::RowByRow,
    })
}

/// PostgreSQL: the batch in one statement, its own transaction ([`finish_many`]). A row
/// whose student refused its user is then recorded alone, which finds out why (and
/// records it after all, should the student have changed meanwhile).
async fn record_in_one_statement(
    db: &DatabaseConnection,
    relay_id: &str,
    deliveries: &[(outbox::Model, Delivered)],
) -> Result<Recorded, DbErr> {
    // Crash point: the statement is the transaction. Before it commits every row is still
    // leased and will be delivered again, Users answering from its inbox; after it, every
    // row it finished is done and its student linked.
    let finished = finish_many::finish_in_one_statement(db, relay_id, deliveries).await?;
    let mut path = match deliveries {
        [_] => BatchPath::Alone,
        _ => BatchPath::Set,
    };
    let mut results = Vec::with_capacity(deliveries.len());
    for ((row, delivered), finish) in deliveries.iter().zip(finished) {
        results.push(match finish {
            Finish::Done => Ok(()),
            Finish::ClaimLost => Err(RecordError::ClaimLost(row.id)),
            Finish::Refused => {
                if path == BatchPath::Set {
                    path = BatchPath::RowByRow;
                }
                record_delivery(db, row, relay_id, *delivered).await
            }
        });
    }
    Ok(Recorded { results, path })
}

/// Records a `failed` row's delivery and marks it `done`, for `retry-failed`: Users' inbox
/// says the row's key was executed after all (its answer was lost), or an operator found
/// the user Users holds for the student. Fenced by the row's status and key, so a row
/// redriven meanwhile is left alone ([`RecordError::ClaimLost`]). The student's rows held
/// back behind it have their keys dated now in the same transaction (see [`redrive`]).
pub async fn record_found_in_inbox(
    db: &DatabaseConnection,
    row: &outbox::Model,
    delivered: Delivered,
) -> Result<(), RecordError> {
    let finish = mark_done(delivered.user_id())
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.eq(OutboxStatus::Failed))
        .filter(outbox::Column::IdempotencyKey.eq(row.idempotency_key.as_str()))
        .col_expr(
            outbox::Column::FailureKind,
            Expr::value(Option::<FailureKind>::None),
        );
    let txn = begin_write(db).await?;
    apply_delivery(&txn, row, finish, delivered).await?;
    date_held_back_keys_now(&txn, row).await?;
    txn.commit().await?;
    Ok(())
}

/// The update that marks a row `done` with its user, lease cleared.
fn mark_done(user_id: Uuid) -> UpdateMany<outbox::Entity> {
    without_lease(outbox::Entity::update_many())
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Done))
        .col_expr(
            outbox::Column::DeliveredUserId,
            Expr::value(user_id.to_string()),
        )
        .col_expr(outbox::Column::ProcessedAt, Expr::value(now()))
        .col_expr(
            outbox::Column::LastError,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            outbox::Column::ErrorCode,
            Expr::value(Option::<String>::None),
        )
}

/// The one transaction that finishes a delivery: the fenced `finish` update of the row,
/// then the student. The row goes first so that a lost claim is found before anything is
/// written, and its row lock (PostgreSQL) keeps a competing claim out until commit.
async fn finish_delivery(
    db: &DatabaseConnection,
    row: &outbox::Model,
    finish: UpdateMany<outbox::Entity>,
    delivered: Delivered,
) -> Result<(), RecordError> {
    let txn = begin_write(db).await?;
    apply_delivery(&txn, row, finish, delivered).await?;
    // Crash point: before this commit the row is still leased (or failed) and will be
    // delivered again, Users answering from its inbox; after it, the student shows it.
    txn.commit().await?;
    Ok(())
}

/// The statements that finish a delivery, inside the caller's transaction: the fenced
/// `finish` update of the row, then the student. The row goes first so that a lost claim
/// is found before anything is written, and its row lock (PostgreSQL) keeps a competing
/// claim out until commit. On an error the caller rolls back.
async fn apply_delivery(
    txn: &impl sea_orm::ConnectionTrait,
    row: &outbox::Model,
    finish: UpdateMany<outbox::Entity>,
    delivered: Delivered,
) -> Result<(), RecordError> {
    if finish.exec(txn).await?.rows_affected != 1 {
        return Err(RecordError::ClaimLost(row.id));
    }
    let student_id = row.aggregate_id;
    // Users now reflects this version (or a newer one): `synced_version` is raised in the
    // same statement as the link check, and never lowered, so a late or repeated finish
    // changes nothing. One statement per row: each is a round trip.
    let synced = Expr::case(
        Expr::col(students::Column::SyncedVersion).lt(row.aggregate_version),
        row.aggregate_version,
    )
    .finally(Expr::col(students::Column::SyncedVersion));
    let student = students::Entity::update_many()
        .col_expr(students::Column::SyncedVersion, synced.into())
        .filter(students::Column::Id.eq(student_id));
    let (user_id, student) = match delivered {
        // Link the new user, or find it already linked (a repeat); never another one.
        Delivered::UserCreated(user_id) => (
            user_id,
            student
                .col_expr(students::Column::UserId, Expr::value(user_id))
                .col_expr(students::Column::UpdatedAt, Expr::value(now()))
                .filter(
                    students::Column::UserId
                        .is_null()
                        .or(students::Column::UserId.eq(user_id)),
                ),
        ),
        // The user Users changed must be the student's own.
        Delivered::UserChanged(user_id) => (
            user_id,
            student.filter(students::Column::UserId.eq(user_id)),
        ),
    };
    if student.exec(txn).await?.rows_affected == 0 {
        return Err(link_problem(txn, student_id, user_id).await?);
    }
    Ok(())
}

/// Why student `student_id` cannot take `returned` as its user.
async fn link_problem(
    txn: &impl sea_orm::ConnectionTrait,
    student_id: Uuid,
    returned: Uuid,
) -> Result<RecordError, DbErr> {
    let student = students::Entity::find_by_id(student_id).one(txn).await?;
    Ok(match student {
        None => RecordError::StudentMissing(student_id),
        Some(student) => match student.user_id {
            Some(linked) => RecordError::LinkConflict {
                student_id,
                linked,
                returned,
            },
            None => RecordError::NotLinked {
                student_id,
                returned,
            },
        },
    })
}

/// Gives a row back as `pending` after a transient failure, not before `delay` from now.
/// Returns false, changing nothing, if the row is no longer held by this claim.
pub async fn record_retry(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    problem: &Problem,
    delay: Duration,
) -> Result<bool, DbErr> {
    give_back(db, row, relay_id, problem, delay, AttemptUsed::Yes).await
}

/// Gives a row back as `pending`, due after `delay`, when Users shed its call
/// (RESOURCE_EXHAUSTED: overloaded, the request not even judged), handing back the attempt
/// its claim counted: overload, however long, never uses up a row's attempts. Returns
/// false, changing nothing, if the row is no longer held by this claim.
///
/// The next claim counts the same attempt number again; that cannot confuse the fence
/// (`held_by_claim`), since this claim ends here and leaves nothing in flight.
pub async fn record_shed(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    problem: &Problem,
    delay: Duration,
) -> Result<bool, DbErr> {
    give_back(db, row, relay_id, problem, delay, AttemptUsed::No).await
}

/// Whether a row given back keeps the attempt its claim counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptUsed {
    Yes,
    No,
}

async fn give_back(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    problem: &Problem,
    delay: Duration,
    attempt: AttemptUsed,
) -> Result<bool, DbErr> {
    let backend = db.get_database_backend();
    let available_at = match backend {
        DbBackend::Postgres => {
            Expr::cust_with_values("now() + $1 * interval '1 millisecond'", [millis(delay)])
        }
        _ => Expr::value(now() + delay),
    };
    let retried = held_by_claim(without_lease(outbox::Entity::update_many()), row, relay_id)
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Pending))
        .col_expr(outbox::Column::ErrorCode, Expr::value(problem.code.clone()))
        .col_expr(
            outbox::Column::LastError,
            Expr::value(problem.message.clone()),
        )
        .col_expr(outbox::Column::AvailableAt, available_at);
    let retried = match attempt {
        AttemptUsed::Yes => retried,
        AttemptUsed::No => retried.col_expr(
            outbox::Column::Attempts,
            Expr::col(outbox::Column::Attempts).sub(1),
        ),
    }
    .exec(db)
    .await?;
    Ok(retried.rows_affected == 1)
}

/// Marks a row `failed` for good. Returns false, changing nothing, if the row is no longer
/// held by this claim (the relay that holds it reaches its own verdict; a rejection is
/// saved in Users' inbox, so it will be the same).
pub async fn record_failure(
    db: &DatabaseConnection,
    row: &outbox::Model,
    relay_id: &str,
    kind: FailureKind,
    problem: &Problem,
) -> Result<bool, DbErr> {
    let failed = held_by_claim(without_lease(outbox::Entity::update_many()), row, relay_id)
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Failed))
        .col_expr(outbox::Column::FailureKind, Expr::value(kind))
        .col_expr(outbox::Column::ErrorCode, Expr::value(problem.code.clone()))
        .col_expr(
            outbox::Column::LastError,
            Expr::value(problem.message.clone()),
        )
        .col_expr(outbox::Column::ProcessedAt, Expr::value(now()))
        .exec(db)
        .await?;
    Ok(failed.rows_affected == 1)
}

/// One claim of one row: the row and the attempt that claim counted. A relay's lease may
/// run out and the same relay claim the row again; the attempt tells the two claims apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub id: i64,
    pub attempts: i32,
}

impl From<&outbox::Model> for Claim {
    fn from(row: &outbox::Model) -> Self {
        Self {
            id: row.id,
            attempts: row.attempts,
        }
    }
}

/// Hands back rows this relay claimed but never sent (too little lease left to send, or it
/// is stopping): `pending` again, due at once, the claim's attempt uncounted, so another
/// relay takes them immediately. Only a row still held by that very claim goes back: not
/// one another relay has claimed since, nor one this relay has claimed again.
pub async fn release(
    db: &DatabaseConnection,
    claims: &[Claim],
    relay_id: &str,
) -> Result<u64, DbErr> {
    if claims.is_empty() {
        return Ok(0);
    }
    let held = claims.iter().fold(Condition::any(), |held, claim| {
        held.add(
            Condition::all()
                .add(outbox::Column::Id.eq(claim.id))
                .add(outbox::Column::Attempts.eq(claim.attempts)),
        )
    });
    let released = without_lease(outbox::Entity::update_many())
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Pending))
        .col_expr(
            outbox::Column::Attempts,
            Expr::col(outbox::Column::Attempts).sub(1),
        )
        .col_expr(
            outbox::Column::AvailableAt,
            shared_now(db.get_database_backend()),
        )
        .filter(held)
        .filter(outbox::Column::Status.eq(OutboxStatus::Processing))
        .filter(outbox::Column::LockedBy.eq(relay_id))
        .exec(db)
        .await?;
    Ok(released.rows_affected)
}

/// Puts a `failed` row back to `pending`, due at once with its attempts reset, under
/// `key`: its own (the same operation, tried again) or a fresh one (a new operation).
/// Returns false, changing nothing, if the row is no longer `failed` with the key it was
/// read with.
///
/// In the same transaction the student's rows held back behind it have their keys dated
/// now ([`date_held_back_keys_now`]). The student row is locked first, as a student's
/// changes lock it before they add a row, so that `relay resend`, which puts a student's
/// delivered rows back under that lock, never sees this row `failed` while it becomes
/// sendable.
pub async fn redrive(
    db: &DatabaseConnection,
    row: &outbox::Model,
    key: &str,
) -> Result<bool, DbErr> {
    let txn = begin_write(db).await?;
    students::Entity::find_by_id(row.aggregate_id)
        .lock_exclusive()
        .one(&txn)
        .await?;
    let redriven = back_to_pending(outbox::Entity::update_many(), db.get_database_backend())
        .col_expr(outbox::Column::IdempotencyKey, Expr::value(key.to_owned()))
        .col_expr(
            outbox::Column::KeyCreatedAt,
            if key == row.idempotency_key {
                Expr::value(row.key_created_at)
            } else {
                Expr::value(Some(now()))
            },
        )
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.eq(OutboxStatus::Failed))
        .filter(outbox::Column::IdempotencyKey.eq(row.idempotency_key.as_str()))
        .exec(&txn)
        .await?;
    if redriven.rows_affected != 1 {
        return Ok(false);
    }
    date_held_back_keys_now(&txn, row).await?;
    txn.commit().await?;
    Ok(true)
}

/// Dates now the keys of the rows of `failed`'s student held back behind it, as it leaves
/// `failed`. None of them was ever sent (a student's rows go to Users one at a time, in
/// order, and `failed` never finished; and a claim counts an attempt, given back only with
/// a row handed back unsent, so each has none), so Users cannot have executed and purged
/// them; yet after a long failure their keys look older than Users keeps keys, and each
/// would be refused as `expired` in turn.
async fn date_held_back_keys_now(
    txn: &impl sea_orm::ConnectionTrait,
    failed: &outbox::Model,
) -> Result<(), DbErr> {
    outbox::Entity::update_many()
        .col_expr(outbox::Column::KeyCreatedAt, Expr::value(Some(now())))
        .filter(outbox::Column::AggregateId.eq(failed.aggregate_id))
        .filter(outbox::Column::AggregateVersion.gt(failed.aggregate_version))
        .filter(outbox::Column::Status.eq(OutboxStatus::Pending))
        .filter(outbox::Column::Attempts.eq(0))
        .exec(txn)
        .await?;
    Ok(())
}

/// Deletes the `done` rows finished more than `retention` ago, oldest first, in batches of
/// one short statement each (found through `outbox_done_by_time`, never by a scan); never a
/// `pending`, `processing` or `failed` row. Returns how many were deleted.
///
/// On PostgreSQL a batch skips rows another purge has locked, so relays purging at once
/// never wait on each other.
pub async fn purge_done(db: &DatabaseConnection, retention: Duration) -> Result<u64, DbErr> {
    platform::retention::purge_older_than(db, retention, purge_done_batch).await
}

/// One batch of [`purge_done`]: the `batch` oldest `done` rows finished before `horizon`.
pub fn purge_done_batch(
    backend: DbBackend,
    horizon: DateTime<Utc>,
    batch: u64,
) -> DeleteMany<outbox::Entity> {
    let mut oldest = outbox::Entity::find()
        .select_only()
        .column(outbox::Column::Id)
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .filter(outbox::Column::ProcessedAt.lt(horizon))
        .order_by_asc(outbox::Column::ProcessedAt)
        .order_by_asc(outbox::Column::Id)
        .limit(batch)
        .into_query();
    if backend == DbBackend::Postgres {
        oldest.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    }
    outbox::Entity::delete_many()
        .filter(platform::retention::batch_of(
            outbox::Column::Id,
            oldest,
            backend,
        ))
        // Checked again on the row deleted: only ever a done row.
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
}

/// Restricts an update to the row as long as it is held by the claim `row` came from:
/// still `processing`, leased to `relay_id`, at the claim's attempt, under the claim's key.
/// (Every claim counts an attempt, so the attempt tells one claim of a row from the next,
/// even by the same relay. One exception: a claim PostgreSQL lost in a crash, see
/// [`CLAIM_POSTGRES`], counted an attempt that the next claim counts again. Should the same
/// relay claim the row again and then record the lost claim's answer, it records Users'
/// answer to the same key, which is what the new claim would record.)
fn held_by_claim(
    update: UpdateMany<outbox::Entity>,
    row: &outbox::Model,
    relay_id: &str,
) -> UpdateMany<outbox::Entity> {
    update
        .filter(outbox::Column::Id.eq(row.id))
        .filter(outbox::Column::Status.eq(OutboxStatus::Processing))
        .filter(outbox::Column::LockedBy.eq(relay_id))
        .filter(outbox::Column::Attempts.eq(row.attempts))
        .filter(outbox::Column::IdempotencyKey.eq(row.idempotency_key.as_str()))
}

/// Sets an update's rows `pending` again as an operator's redrive does: due now, with no
/// attempt counted, no failure and no finish time.
pub(crate) fn back_to_pending(
    update: UpdateMany<outbox::Entity>,
    backend: DbBackend,
) -> UpdateMany<outbox::Entity> {
    update
        .col_expr(outbox::Column::Status, Expr::value(OutboxStatus::Pending))
        .col_expr(outbox::Column::Attempts, Expr::value(0))
        .col_expr(outbox::Column::AvailableAt, shared_now(backend))
        .col_expr(
            outbox::Column::FailureKind,
            Expr::value(Option::<FailureKind>::None),
        )
        .col_expr(
            outbox::Column::ProcessedAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
}

/// Adds "no relay holds this row" (`locked_by`, `locked_until` cleared) to an update.
fn without_lease(update: UpdateMany<outbox::Entity>) -> UpdateMany<outbox::Entity> {
    update
        .col_expr(
            outbox::Column::LockedBy,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            outbox::Column::LockedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
}

/// The claim on PostgreSQL: `FOR UPDATE SKIP LOCKED`, lease times from the database clock.
///
/// The candidates are chosen in a `MATERIALIZED` CTE, evaluated exactly once. Written as
/// `UPDATE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`, the planner may run
/// the sub-select once per outer row, and each run locks up to `n` more rows: a claim of 16
/// took thousands. The `status IN (…)` conjunct lets the planner use the partial index
/// `outbox_claimable` (unfinished rows in id order), so a claim never walks the `done`
/// history.
///
/// The claim commits without waiting for the disk (`no_flush`: `synchronous_commit` off for
/// this statement's transaction only), taking one of the four serial flushes off a row's way
/// from CreateStudent to linked. A claim is only a lease, so losing it is safe: if the
/// database crashes before the claim reaches the disk, the row is due again as if its relay
/// had died, and is redelivered under the same key, which Users answers from its inbox. The
/// claiming relay's finalize cannot land without it either: the finalize commits durably,
/// and PostgreSQL writes its log in order, so a finalize on disk has its claim on disk.
static CLAIM_POSTGRES: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"WITH no_flush AS MATERIALIZED (
                  SELECT set_config('synchronous_commit', 'off', true) AS setting),
                claimed AS MATERIALIZED (
                  SELECT candidate.id FROM outbox AS candidate CROSS JOIN no_flush
                   WHERE candidate.status IN ({pending}, {processing})
                     AND ((candidate.status = {pending} AND candidate.available_at <= now())
                       OR (candidate.status = {processing} AND candidate.locked_until < now()))
                     AND {in_order}
                   ORDER BY candidate.id
                   LIMIT {LIMIT}
                     FOR UPDATE OF candidate SKIP LOCKED)
           UPDATE outbox
              SET status = {processing}, locked_by = $1,
                  locked_until = now() + $2 * interval '1 millisecond',
                  attempts = attempts + 1
             FROM claimed
            WHERE outbox.id = claimed.id
        RETURNING {columns}"#,
        processing = literal(OutboxStatus::Processing),
        pending = literal(OutboxStatus::Pending),
        in_order = *OLDEST_UNFINISHED,
        columns = outbox_columns_of("outbox")
    )
});

/// How a relay's connections to the Student DB start on PostgreSQL: without bitmap scans.
///
/// The claim wants one plan, whatever the statistics say: `outbox_claimable` walked in id
/// order, stopping after its limit. Before autovacuum first analyzes a new outbox (about a
/// minute; `reltuples` is -1), PostgreSQL planned it as a bitmap scan of every due row, the
/// per-student `MIN` for each, and a sort: 38.8 ms for a claim of 32 behind 20,000 due rows,
/// against 0.4 ms in id order (BENCHMARKS-JOURNAL.md, "A brand-new outbox"). With bitmap scans off
/// it walks the index in order at once. (A planner setting cannot be scoped to one
/// statement without a transaction around it, a round trip more per claim. The relay's
/// other statements find rows by id, or count one status through its partial index,
/// which a plain index scan serves as well.)
pub const CLAIMING_SESSION: &[(&str, &str)] = &[("enable_bitmapscan", "off")];

/// Where [`CLAIM_POSTGRES`] takes its limit, as a literal.
const LIMIT: &str = "/*limit*/";

/// The claim on SQLite: one UPDATE under the single write lock, times bound by the caller.
static CLAIM_SQLITE: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"UPDATE outbox
              SET status = {processing}, locked_by = ?, locked_until = ?,
                  attempts = attempts + 1
            WHERE id IN (
                  SELECT candidate.id FROM outbox AS candidate
                   WHERE candidate.status IN ({pending}, {processing})
                     AND ((candidate.status = {pending} AND candidate.available_at <= ?)
                       OR (candidate.status = {processing} AND candidate.locked_until < ?))
                     AND {in_order}
                   ORDER BY candidate.id
                   LIMIT ?)
        RETURNING {columns}"#,
        processing = literal(OutboxStatus::Processing),
        pending = literal(OutboxStatus::Pending),
        in_order = *OLDEST_UNFINISHED,
        columns = outbox_columns()
    )
});

/// Whether any row waits as `pending` (due now or backing off), read without the write
/// lock a claim takes. The `status IN (…)` term lets SQLite use the partial index
/// `outbox_claimable`, so the read costs the unfinished rows, not the `done` history. The
/// relay's SQLite watcher asks it when the file changed and wakes the relay only if it
/// holds: a commit that left nothing pending (the relay's own claim or finalize) costs no
/// claim.
///
/// Rows backing off and rows held behind a failed row of their student count too, so while
/// one exists the relay's own finalizes wake it for a claim that finds nothing (at most
/// one per 40 ms, the watcher's least gap between wake-ups). Asking for due rows only
/// would cost more: the index is in `id` order, so the read would walk every row not yet
/// due before the first due one, up to 100 times a second, and after a Users outage those
/// are the whole backlog.
pub static ANY_PENDING: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT EXISTS (SELECT 1 FROM outbox \
          WHERE status IN ({pending}, {processing}) AND status = {pending})",
        pending = literal(OutboxStatus::Pending),
        processing = literal(OutboxStatus::Processing),
    )
});

/// Per-student order: a row is claimable only when it is the oldest unfinished row of its
/// student (every row with a lower `aggregate_version` is `done`). A failed or waiting row
/// holds back the later rows of its own student, never anyone else's.
///
/// Written as a scalar `MIN` over the partial index `outbox_unfinished_by_student`: one index
/// probe per candidate, whatever the statistics say. The same test written `NOT EXISTS (an
/// earlier unfinished row)` becomes an anti-join, and with statistics gathered while the
/// outbox was quiet (every row `done`, so the index looks empty) PostgreSQL planned that join
/// as a walk of the whole index per candidate: 129 ms for a claim of 64 with 10,000 rows due
/// after 1,000,000 done (`loadgen claim-cost`), just when a backlog after an outage needs
/// draining.
static OLDEST_UNFINISHED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "candidate.aggregate_version = \
           (SELECT MIN(earlier.aggregate_version) FROM outbox AS earlier \
             WHERE earlier.aggregate_id = candidate.aggregate_id \
               AND earlier.status <> {done})",
        done = literal(OutboxStatus::Done)
    )
});

/// Rows held back behind an earlier `failed` row of their student. (The `IN` term is
/// [`UNDELIVERED`], for SQLite's planner.)
static BLOCKED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT COUNT(*) AS blocked FROM outbox AS candidate \
          WHERE candidate.status IN ({undelivered}) AND candidate.status = {pending} \
            AND EXISTS (SELECT 1 FROM outbox AS earlier \
                         WHERE earlier.aggregate_id = candidate.aggregate_id \
                           AND earlier.aggregate_version < candidate.aggregate_version \
                           AND earlier.status = {failed})",
        undelivered = UNDELIVERED.map(literal).join(", "),
        pending = literal(OutboxStatus::Pending),
        failed = literal(OutboxStatus::Failed),
    )
});

/// A status as an SQL string literal, spelled by the entity (the values are plain words,
/// so quoting needs no escaping).
fn literal(status: OutboxStatus) -> String {
    format!("'{}'", status.to_value())
}

/// The outbox entity's columns, quoted and comma-separated. Named, never `*`: a cached
/// statement must not change shape when the schema gains a column.
fn outbox_columns() -> String {
    outbox::Column::iter()
        .map(|column| format!("\"{}\"", column.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`outbox_columns`], qualified by `table` (where a statement joins another relation).
fn outbox_columns_of(table: &str) -> String {
    outbox::Column::iter()
        .map(|column| format!("{table}.\"{}\"", column.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Row counts per status and the age of the oldest undelivered row: `relay status`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OutboxReport {
    pub pending: i64,
    pub processing: i64,
    pub done: i64,
    pub failed: i64,
    /// Seconds since the oldest `pending` or `processing` row was written; 0 when none.
    pub oldest_pending_age_seconds: i64,
    /// `pending` rows that failed at least once and are waiting to be retried (Users down,
    /// overloaded, or refusing the relay's token: the relay's log says which).
    pub retrying: i64,
    /// Rows held back behind an earlier `failed` row of their student (their status is
    /// `pending`; they are not counted in `pending`).
    pub blocked: i64,
}

/// Every outbox row of `student_id`, in the order the relay delivers them (`relay show`).
pub async fn rows_of_student(
    db: &DatabaseConnection,
    student_id: Uuid,
) -> Result<Vec<outbox::Model>, DbErr> {
    outbox::Entity::find()
        .filter(outbox::Column::AggregateId.eq(student_id))
        .order_by_asc(outbox::Column::AggregateVersion)
        .order_by_asc(outbox::Column::Id)
        .all(db)
        .await
}

/// How `done` rows are counted in an [`OutboxReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneCount {
    /// Counted: `relay status`, an operator's question (cost grows with the history).
    Exact,
    /// On PostgreSQL, the planner's row estimate for the table minus the rows counted
    /// exactly (the metrics gauge, read every few seconds by every relay); exact on SQLite.
    Estimated,
}

/// The rows still to deliver: `outbox_claimable`'s predicate. A filter that spells it out
/// lets both planners use that index (SQLite's does not see that `status = 'pending'`
/// alone implies it).
const UNDELIVERED: [OutboxStatus; 2] = [OutboxStatus::Pending, OutboxStatus::Processing];

/// Reads the [`OutboxReport`]. Every part but an exact `done` count reads only the rows
/// still to deliver or failed, through the partial indexes `outbox_claimable` and
/// `outbox_failed`, so its cost does not grow with the delivered history.
pub async fn report(db: &DatabaseConnection, done: DoneCount) -> Result<OutboxReport, DbErr> {
    let mut report = OutboxReport::default();
    let undelivered: Vec<(OutboxStatus, i64)> =
        undelivered_by_status().into_tuple().all(db).await?;
    for (status, rows) in undelivered {
        match status {
            OutboxStatus::Pending => report.pending = rows,
            OutboxStatus::Processing => report.processing = rows,
            OutboxStatus::Done | OutboxStatus::Failed => {}
        }
    }
    report.failed = count(db, with_status(OutboxStatus::Failed)).await?;
    report.done = match (done, db.get_database_backend()) {
        (DoneCount::Estimated, DbBackend::Postgres) => match table_estimate(db).await? {
            Some(rows) => Ord::max(rows - report.pending - report.processing - report.failed, 0),
            None => count(db, with_status(OutboxStatus::Done)).await?,
        },
        _ => count(db, with_status(OutboxStatus::Done)).await?,
    };
    if let Some(row) = oldest_undelivered().one(db).await? {
        report.oldest_pending_age_seconds = Ord::max((now() - row.created_at).num_seconds(), 0);
    }
    let blocked = db
        .query_one_raw(blocked(db.get_database_backend()))
        .await?
        .map(|row| row.try_get::<i64>("", "blocked"))
        .transpose()?
        .unwrap_or(0);
    report.blocked = blocked;
    report.pending -= blocked;
    report.retrying = count(db, retrying()).await?;
    Ok(report)
}

/// The statements [`report`] runs on the outbox table, by name (the counts without their
/// `COUNT` around them): each finds its rows, those still to deliver or failed, through a
/// partial index, never by reading the `done` history. (Not the `done` count: PostgreSQL's
/// estimate reads no row, SQLite's exact count reads every done row's index entry.)
pub fn report_statements(backend: DbBackend) -> Vec<(&'static str, Statement)> {
    vec![
        (
            "undelivered by status",
            undelivered_by_status().build(backend),
        ),
        ("failed", with_status(OutboxStatus::Failed).build(backend)),
        ("oldest undelivered", oldest_undelivered().build(backend)),
        ("blocked", blocked(backend)),
        ("retrying", retrying().build(backend)),
    ]
}

/// `status IN (…)` with the values written out, never bound: SQLite uses a partial index
/// (`outbox_claimable`) only for a condition that names its values, and with them bound as
/// parameters it read the whole table, history and all, for each gauge. (PostgreSQL plans
/// either form through the index.)
fn status_in(statuses: &[OutboxStatus]) -> Expr {
    let values: Vec<String> = statuses.iter().copied().map(literal).collect();
    Expr::cust(format!("\"status\" IN ({})", values.join(", ")))
}

/// `status = …`, written out as [`status_in`] is; an `=`, since SQLite does not take a
/// one-value `IN` for the `=` of a partial index's condition (`outbox_failed`).
fn status_is(status: OutboxStatus) -> Expr {
    Expr::cust(format!("\"status\" = {}", literal(status)))
}

fn undelivered_by_status() -> Select<outbox::Entity> {
    outbox::Entity::find()
        .select_only()
        .column(outbox::Column::Status)
        .column_as(outbox::Column::Id.count(), "rows")
        .filter(status_in(&UNDELIVERED))
        .group_by(outbox::Column::Status)
}

fn with_status(status: OutboxStatus) -> Select<outbox::Entity> {
    outbox::Entity::find().filter(status_is(status))
}

/// Ids grow with creation, so the oldest undelivered row is the first in
/// `outbox_claimable`: one index probe, not a sort of the backlog.
fn oldest_undelivered() -> Select<outbox::Entity> {
    outbox::Entity::find()
        .filter(status_in(&UNDELIVERED))
        .order_by_asc(outbox::Column::Id)
        .limit(1)
}

fn blocked(backend: DbBackend) -> Statement {
    Statement::from_string(backend, BLOCKED.as_str())
}

fn retrying() -> Select<outbox::Entity> {
    outbox::Entity::find()
        // `UNDELIVERED` first, for SQLite's planner.
        .filter(status_in(&UNDELIVERED))
        .filter(status_is(OutboxStatus::Pending))
        .filter(outbox::Column::Attempts.gt(0))
}

async fn count(db: &DatabaseConnection, rows: Select<outbox::Entity>) -> Result<i64, DbErr> {
    Ok(i64::try_from(rows.count(db).await?).unwrap_or(i64::MAX))
}

/// PostgreSQL's estimate of the outbox's rows (kept by autovacuum and ANALYZE); `None`
/// before the table was ever analysed.
async fn table_estimate(db: &DatabaseConnection) -> Result<Option<i64>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT reltuples::bigint AS rows FROM pg_class WHERE oid = 'outbox'::regclass",
        ))
        .await?;
    let rows = row.map(|row| row.try_get::<i64>("", "rows")).transpose()?;
    Ok(rows.filter(|rows| *rows >= 0))
}

/// `failed` rows, oldest first: the one with `id`, or all of them.
pub async fn failed_rows(
    db: &DatabaseConnection,
    id: Option<i64>,
) -> Result<Vec<outbox::Model>, DbErr> {
    let mut query = outbox::Entity::find()
        .filter(outbox::Column::Status.eq(OutboxStatus::Failed))
        .order_by_asc(outbox::Column::Id);
    if let Some(id) = id {
        query = query.filter(outbox::Column::Id.eq(id));
    }
    query.all(db).await
}

/// Which delivered rows to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DoneRows {
    Student(Uuid),
    Key(String),
    All,
}

/// `done` rows, oldest first.
pub async fn done_rows(
    db: &DatabaseConnection,
    which: &DoneRows,
) -> Result<Vec<outbox::Model>, DbErr> {
    let query = outbox::Entity::find()
        .filter(outbox::Column::Status.eq(OutboxStatus::Done))
        .order_by_asc(outbox::Column::Id);
    let query = match which {
        DoneRows::Student(id) => query.filter(outbox::Column::AggregateId.eq(*id)),
        DoneRows::Key(key) => query.filter(outbox::Column::IdempotencyKey.eq(key.as_str())),
        DoneRows::All => query,
    };
    query.all(db).await
}

/// The user each row's student is linked to, read in a few queries rather than one per row.
pub async fn linked_users(
    db: &DatabaseConnection,
    rows: &[outbox::Model],
) -> Result<HashMap<Uuid, Uuid>, DbErr> {
    // Chunks stay far below every backend's limit on bound parameters.
    const CHUNK: usize = 1_000;
    let mut links = HashMap::with_capacity(rows.len());
    for chunk in rows.chunks(CHUNK) {
        let students = students::Entity::find()
            .filter(students::Column::Id.is_in(chunk.iter().map(|row| row.aggregate_id)))
            .all(db)
            .await?;
        links.extend(
            students
                .into_iter()
                .filter_map(|s| Some((s.id, s.user_id?))),
        );
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change delivered while its student lost its link fails as `NOT_LINKED`, the reason
    /// README gives it, not as a conflict with a link it does not have.
    #[test]
    fn each_delivery_that_cannot_be_recorded_fails_with_its_own_reason() {
        let (student_id, linked, returned) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let reasons = [
            RecordError::LinkConflict {
                student_id,
                linked,
                returned,
            },
            RecordError::NotLinked {
                student_id,
                returned,
            },
            RecordError::StudentMissing(student_id),
        ]
        .map(|err| err.code());
        assert_eq!(reasons, ["LINK_CONFLICT", "NOT_LINKED", "STUDENT_MISSING"]);
    }
}
