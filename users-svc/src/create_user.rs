//! CreateUser, made idempotent by the inbox.
//!
//! The user and the inbox row (key, request fingerprint, saved answer) are written in ONE
//! transaction. Whether two *different* operations may both succeed (two users with one
//! document number) is a domain rule, enforced by the `users` table's own unique index.

use platform::{
    db::{begin_write, insert_both, is_unique_violation, now},
    failpoint, redact,
};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, QueryTrait, Set, Statement,
};
use tonic::Code;
use uuid::Uuid;

use crate::{
    answer_cache::AnswerCache,
    entity::{
        inbox::{self as inbox_row, Entity as InboxEntity, SavedOutcome},
        users,
    },
    error::Error,
    inbox::{self, Answer, Mode},
    new_user::NewUser,
};

/// Executes `new` once per idempotency key, or answers with what its key already got.
#[tracing::instrument(skip_all, fields(idempotency_key = %new.idempotency_key, student_id = %new.student_id), err(level = "debug"))]
pub async fn create_user(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    new: NewUser,
    mode: Mode,
) -> Result<Answer, Error> {
    let request_hash = new.request_hash();
    let request = inbox::Request {
        key: &new.idempotency_key,
        request_hash: &request_hash,
    };
    // A first delivery, the usual case, goes straight to its write: the inbox row's
    // primary key is what refuses a second execution, and a repeat this process does not
    // remember finds its answer after that refusal. Only a key that must not execute is
    // looked up first.
    let known = match mode {
        Mode::Execute => inbox::recall(answers, request)?,
        Mode::Expired(_) | Mode::ReplayOnly => inbox::replay(db, answers, request, mode).await?,
    };
    if let Some(answer) = known {
        tracing::info!("answered from the inbox");
        return Ok(answer);
    }
    let saved_at = now();
    match insert_user_with_inbox(db, &new, request, saved_at).await {
        Ok(user_id) => {
            let outcome = SavedOutcome::Created { user_id };
            answers.remember(request, &outcome, saved_at);
            tracing::info!(
                %user_id,
                email = %redact::email(&new.email),
                document_number = %redact::document_number(&new.document_number),
                "user created"
            );
            return Ok(Answer {
                outcome,
                replayed: false,
            });
        }
        Err(err) if is_unique_violation(&err) => {}
        Err(err) => return Err(err.into()),
    }
    if let Some(answer) = inbox::after_unique_violation(db, answers, request).await? {
        return Ok(answer);
    }
    // Otherwise the only other unique rule is the domain's: one enabled user per document
    // number. (The database error is not logged: it quotes the document number.)
    tracing::info!("rejected: document number already used by an enabled user");
    inbox::save_rejection(db, answers, request, document_number_taken()).await
}

/// The one transaction that executes a CreateUser: the user and its inbox row, both
/// created at `saved_at`.
async fn insert_user_with_inbox(
    db: &DatabaseConnection,
    new: &NewUser,
    request: inbox::Request<'_>,
    saved_at: chrono::DateTime<chrono::Utc>,
) -> Result<Uuid, sea_orm::DbErr> {
    let (user_id, user, answer) = new_rows(new, request, saved_at)?;
    insert_users_with_inbox(db, vec![(user, answer)]).await?;
    Ok(user_id)
}

/// The one transaction that executes CreateUser for every pair of `rows` (a user and the
/// inbox row that saves its id under its key, see [`new_rows`]): all of them or none.
pub(crate) async fn insert_users_with_inbox(
    db: &DatabaseConnection,
    rows: Vec<(users::ActiveModel, inbox_row::ActiveModel)>,
) -> Result<(), sea_orm::DbErr> {
    let (users, answers): (Vec<_>, Vec<_>) = rows.into_iter().unzip();
    if db.get_database_backend() == DbBackend::Postgres {
        // Crash point: nothing is sent yet. The statement is its own transaction.
        failpoint::hit(failpoint::points::USERS_BEFORE_COMMIT).await;
        db.execute_raw(together(users, answers)).await?;
    } else {
        let txn = begin_write(db).await?;
        users::Entity::insert_many(users)
            .exec_without_returning(&txn)
            .await?;
        InboxEntity::insert_many(answers)
            .exec_without_returning(&txn)
            .await?;
        failpoint::hit(failpoint::points::USERS_BEFORE_COMMIT).await;
        // Crash point: before this commit nothing exists; after it, the users and the
        // answers that any redelivery of their keys will get.
        txn.commit().await?;
    }
    failpoint::hit(failpoint::points::USERS_AFTER_COMMIT).await;
    Ok(())
}

/// The two rows a CreateUser writes: a new user, and the inbox row that saves the answer
/// (its id) under the key.
fn new_rows(
    new: &NewUser,
    request: inbox::Request<'_>,
    saved_at: chrono::DateTime<chrono::Utc>,
) -> Result<(Uuid, users::ActiveModel, inbox_row::ActiveModel), DbErr> {
    let user_id = Uuid::now_v7();
    let user = users::ActiveModel {
        id: Set(user_id),
        email: Set(new.email.clone()),
        first_name: Set(new.first_name.clone()),
        last_name: Set(new.last_name.clone()),
        document_number: Set(new.document_number.clone()),
        student_id: Set(new.student_id),
        enabled: Set(true),
        created_at: Set(saved_at),
        // A new user reflects its student as created: version 1.
        source_version: Set(1),
    };
    let answer = inbox::entry(request, &SavedOutcome::Created { user_id }, saved_at)?;
    Ok((user_id, user, answer))
}

/// The rows that execute each of `requests` for the first time, all saved at `saved_at`:
/// each new user's id, and each user with the inbox row that saves its id (see
/// [`new_rows`]), in order.
pub(crate) fn first_execution_rows<'a>(
    requests: impl IntoIterator<Item = (&'a NewUser, inbox::Request<'a>)>,
    saved_at: chrono::DateTime<chrono::Utc>,
) -> Result<FirstExecution, DbErr> {
    let mut ids = Vec::new();
    let mut rows = Vec::new();
    for (new, request) in requests {
        let (user_id, user, answer) = new_rows(new, request, saved_at)?;
        ids.push(user_id);
        rows.push((user, answer));
    }
    Ok((ids, rows))
}

/// What [`first_execution_rows`] returns: the new users' ids, and the rows to insert.
pub(crate) type FirstExecution = (Vec<Uuid>, Vec<(users::ActiveModel, inbox_row::ActiveModel)>);

/// The statement that executes `news` for the first time on PostgreSQL (one CreateUser,
/// or the items of a CreateUsers), for the tests that hold `bench/pgbench/create_user.sql`
/// and `create_users.sql` to it.
pub fn create_statement(news: &[NewUser]) -> Result<Statement, DbErr> {
    let hashes: Vec<String> = news.iter().map(NewUser::request_hash).collect();
    let requests = news.iter().zip(&hashes).map(|(new, request_hash)| {
        let request = inbox::Request {
            key: &new.idempotency_key,
            request_hash,
        };
        (new, request)
    });
    let (_, rows) = first_execution_rows(requests, now())?;
    let (users, answers) = rows.into_iter().unzip();
    Ok(together(users, answers))
}

/// PostgreSQL: the users and their inbox rows in ONE statement (see
/// [`platform::db::insert_both`]), one round trip instead of four.
fn together(users: Vec<users::ActiveModel>, answers: Vec<inbox_row::ActiveModel>) -> Statement {
    DbBackend::Postgres.build(&insert_both(
        users::Entity::insert_many(users).into_query(),
        InboxEntity::insert_many(answers).into_query(),
    ))
}

fn document_number_taken() -> SavedOutcome {
    SavedOutcome::Rejected {
        code: Code::AlreadyExists as i32,
        reason: "DOCUMENT_NUMBER_TAKEN".to_owned(),
        message: "document_number is already used by another enabled user".to_owned(),
    }
}
