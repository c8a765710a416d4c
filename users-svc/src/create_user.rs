//! CreateUser, made idempotent by the inbox.
//!
//! The inbox answers one question only: is this the same operation (the same key)? The
//! user and the inbox row (key, request fingerprint, saved answer) are written in ONE
//! transaction, so no user ever exists without the answer that repeats it, and no answer
//! without its user. Whether two *different* operations may both succeed (two users with
//! one document number) is a domain rule, enforced by the `users` table's own unique index.

use platform::{
    db::{begin_write, is_unique_violation, now},
    failpoint, redact,
};
use sea_orm::{ActiveModelTrait, DatabaseConnection, EntityTrait, Set};
use tonic::Code;
use uuid::Uuid;

use crate::{
    entity::{
        inbox::{self, SavedOutcome},
        users,
    },
    error::Error,
    new_user::NewUser,
};

/// Whether a request may execute, or may only be answered from the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Execute on first sight of the key; answer from the inbox afterwards.
    Execute,
    /// Answer from the inbox only; an unknown key is [`Error::NotInInbox`]. Replays of past
    /// deliveries use this, so they can never create a user.
    ReplayOnly,
}

/// The answer to a CreateUser: what the key's operation produced, and whether it was
/// executed now or replayed from the inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: SavedOutcome,
    pub replayed: bool,
}

/// Executes `new` once per idempotency key, or answers with what its key already got.
#[tracing::instrument(skip_all, fields(idempotency_key = %new.idempotency_key, student_id = %new.student_id), err(level = "debug"))]
pub async fn create_user(
    db: &DatabaseConnection,
    new: NewUser,
    mode: Mode,
) -> Result<Answer, Error> {
    let request_hash = new.request_hash();
    if let Some(answer) = replay(db, &new.idempotency_key, &request_hash).await? {
        tracing::info!("answered from the inbox");
        return Ok(answer);
    }
    if mode == Mode::ReplayOnly {
        return Err(Error::NotInInbox);
    }
    match insert_user_with_inbox(db, &new, &request_hash).await {
        Ok(user_id) => {
            tracing::info!(
                %user_id,
                email = %redact::email(&new.email),
                document_number = %redact::document_number(&new.document_number),
                "user created"
            );
            return Ok(Answer {
                outcome: SavedOutcome::Created { user_id },
                replayed: false,
            });
        }
        Err(err) if is_unique_violation(&err) => {}
        Err(err) => return Err(err.into()),
    }
    // A unique violation is first of all a lost race on the same key: the winner's inbox
    // row is committed by now, so this is a replay, not a domain conflict.
    if let Some(answer) = replay(db, &new.idempotency_key, &request_hash).await? {
        tracing::info!("answered from the inbox (a concurrent delivery of this key executed it)");
        return Ok(answer);
    }
    // Otherwise the only other unique rule is the domain's: one enabled user per document
    // number. (The database error is not logged: it quotes the document number.)
    tracing::info!("rejected: document number already used by an enabled user");
    save_rejection(db, &new, &request_hash, document_number_taken()).await
}

/// The one transaction that executes a CreateUser: the user and its inbox row.
async fn insert_user_with_inbox(
    db: &DatabaseConnection,
    new: &NewUser,
    request_hash: &str,
) -> Result<Uuid, sea_orm::DbErr> {
    let user_id = Uuid::now_v7();
    let created_at = now();
    let txn = begin_write(db).await?;
    users::ActiveModel {
        id: Set(user_id),
        email: Set(new.email.clone()),
        first_name: Set(new.first_name.clone()),
        last_name: Set(new.last_name.clone()),
        document_number: Set(new.document_number.clone()),
        student_id: Set(new.student_id),
        enabled: Set(true),
        created_at: Set(created_at),
    }
    .insert(&txn)
    .await?;
    inbox_row(
        new,
        request_hash,
        &SavedOutcome::Created { user_id },
        created_at,
    )?
    .insert(&txn)
    .await?;
    failpoint::hit(failpoint::points::USERS_BEFORE_COMMIT).await;
    // Crash point: before this commit nothing exists; after it, the user and the answer
    // that any redelivery of this key will get.
    txn.commit().await?;
    failpoint::hit(failpoint::points::USERS_AFTER_COMMIT).await;
    Ok(user_id)
}

/// Saves a deterministic rejection under the key, so a repeat gets the same answer instead
/// of being judged again.
async fn save_rejection(
    db: &DatabaseConnection,
    new: &NewUser,
    request_hash: &str,
    rejection: SavedOutcome,
) -> Result<Answer, Error> {
    let txn = begin_write(db).await?;
    match inbox_row(new, request_hash, &rejection, now())?
        .insert(&txn)
        .await
    {
        Ok(_) => {
            txn.commit().await?;
            Ok(Answer {
                outcome: rejection,
                replayed: false,
            })
        }
        Err(err) if is_unique_violation(&err) => {
            drop(txn);
            // Another request with this key saved its answer first: give that one.
            replay(db, &new.idempotency_key, request_hash)
                .await?
                .ok_or(Error::Db(err))
        }
        Err(err) => Err(err.into()),
    }
}

/// Answers from the inbox when the key is known: the saved answer if the request is the
/// same, [`Error::KeyReused`] if it is not.
async fn replay(
    db: &DatabaseConnection,
    key: &str,
    request_hash: &str,
) -> Result<Option<Answer>, Error> {
    let Some(entry) = inbox::Entity::find_by_id(key.to_owned()).one(db).await? else {
        return Ok(None);
    };
    if entry.request_hash != request_hash {
        return Err(Error::KeyReused);
    }
    let outcome: SavedOutcome = serde_json::from_value(entry.result)
        .map_err(|err| sea_orm::DbErr::Custom(format!("unreadable inbox result: {err}")))?;
    Ok(Some(Answer {
        outcome,
        replayed: true,
    }))
}

fn inbox_row(
    new: &NewUser,
    request_hash: &str,
    outcome: &SavedOutcome,
    created_at: chrono::DateTime<chrono::Utc>,
) -> Result<inbox::ActiveModel, sea_orm::DbErr> {
    let result = serde_json::to_value(outcome)
        .map_err(|err| sea_orm::DbErr::Custom(format!("cannot encode inbox result: {err}")))?;
    Ok(inbox::ActiveModel {
        idempotency_key: Set(new.idempotency_key.clone()),
        request_hash: Set(request_hash.to_owned()),
        result: Set(result),
        created_at: Set(created_at),
    })
}

fn document_number_taken() -> SavedOutcome {
    SavedOutcome::Rejected {
        code: Code::AlreadyExists as i32,
        reason: "DOCUMENT_NUMBER_TAKEN".to_owned(),
        message: "document_number is already used by another enabled user".to_owned(),
    }
}
