//! The inbox: one row per idempotency key already executed, with the answer it got. It
//! answers one question only, for every RPC alike: is this the same operation (the same
//! key)? Each use case writes its effect and the inbox row in ONE transaction, so no
//! effect ever exists without the answer that repeats it, and no answer without its effect.

use std::time::Duration;

use chrono::{DateTime, Utc};
use platform::db::{begin_write, is_unique_violation, now};
use sea_orm::{ActiveModelTrait, DatabaseConnection, DbErr, EntityTrait, Set};

use crate::{
    answer_cache::AnswerCache,
    entity::inbox::{self, SavedOutcome},
    error::Error,
};

/// Whether a request may execute, or may only be answered from the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Execute on first sight of the key; answer from the inbox afterwards.
    Execute,
    /// The caller issued the key longer ago than the inbox keeps entries: answer from the
    /// inbox if the key is there; if it is not, Users cannot tell "never executed" from
    /// "executed and purged", so it executes nothing ([`Error::DeliveryExpired`]).
    Expired(KeyAge),
    /// Answer from the inbox only; an unknown key is [`Error::NotInInbox`]. Replays of past
    /// deliveries use this, so they can never execute anything.
    ReplayOnly,
}

/// When a key was issued, and how long the inbox keeps keys: the facts behind
/// [`Mode::Expired`], for the refusal's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyAge {
    pub issued_at: DateTime<Utc>,
    pub retention: Duration,
    /// A replay-only question (`relay replay`, `retry-failed`) rather than a delivery:
    /// refused the same way, but counted with the unknown keys, not as an expired delivery.
    pub asked_only: bool,
}

/// The answer to a request: what the key's operation produced, and whether it was executed
/// now or replayed from the inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: SavedOutcome,
    pub replayed: bool,
}

/// One request as the inbox sees it: its key and its fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub key: &'a str,
    pub request_hash: &'a str,
}

/// Answers from the inbox when the key is known: the saved answer if the request is the
/// same, [`Error::KeyReused`] if it is not. `None` when the key was never executed (or was
/// purged); in [`Mode::ReplayOnly`] that is [`Error::NotInInbox`], in [`Mode::Expired`]
/// [`Error::DeliveryExpired`]. A key `answers` remembers is answered from memory (see
/// `answer_cache.rs` for why that answer is always the table's).
pub async fn replay(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    request: Request<'_>,
    mode: Mode,
) -> Result<Option<Answer>, Error> {
    if let Some(answer) = recall(answers, request)? {
        return Ok(Some(answer));
    }
    let Some(entry) = inbox::Entity::find_by_id(request.key.to_owned())
        .one(db)
        .await?
    else {
        return match mode {
            Mode::Execute => Ok(None),
            Mode::Expired(age) => Err(Error::DeliveryExpired(age)),
            Mode::ReplayOnly => Err(Error::NotInInbox),
        };
    };
    let outcome: SavedOutcome = serde_json::from_value(entry.result)
        .map_err(|err| DbErr::Custom(format!("unreadable inbox result: {err}")))?;
    let saved = Request {
        key: request.key,
        request_hash: &entry.request_hash,
    };
    answers.remember(saved, &outcome, entry.created_at);
    saved_answer(request, &entry.request_hash, outcome).map(Some)
}

/// Like [`replay`], from memory only: `None` when `answers` does not remember the key,
/// whether or not the table has it.
pub fn recall(answers: &AnswerCache, request: Request<'_>) -> Result<Option<Answer>, Error> {
    let Some(recalled) = answers.recall(request.key, now()) else {
        return Ok(None);
    };
    crate::metrics::answered_from_memory();
    saved_answer(request, &recalled.request_hash, recalled.outcome).map(Some)
}

/// The saved answer to a repeat of `request`, whose key's first request had
/// `saved_hash`: the same answer for the same request, [`Error::KeyReused`] for another.
fn saved_answer(
    request: Request<'_>,
    saved_hash: &str,
    outcome: SavedOutcome,
) -> Result<Answer, Error> {
    if saved_hash != request.request_hash {
        return Err(Error::KeyReused);
    }
    Ok(Answer {
        outcome,
        replayed: true,
    })
}

/// The inbox row that saves `outcome` as the answer to `request`, at `saved_at` (taken
/// with [`now`]; once the row is committed, the same time goes to [`AnswerCache::remember`]).
pub fn entry(
    request: Request<'_>,
    outcome: &SavedOutcome,
    saved_at: DateTime<Utc>,
) -> Result<inbox::ActiveModel, DbErr> {
    let result = serde_json::to_value(outcome)
        .map_err(|err| DbErr::Custom(format!("cannot encode inbox result: {err}")))?;
    Ok(inbox::ActiveModel {
        idempotency_key: Set(request.key.to_owned()),
        request_hash: Set(request.request_hash.to_owned()),
        result: Set(result),
        created_at: Set(saved_at),
    })
}

/// What a use case does when its transaction hit a unique violation: first of all it may
/// be a lost race on the same key, whose winner's inbox row is committed by now, so this is
/// a replay. `None` when the key is still unknown: the violation is the domain's.
pub async fn after_unique_violation(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    request: Request<'_>,
) -> Result<Option<Answer>, Error> {
    let answer = replay(db, answers, request, Mode::Execute).await?;
    if answer.is_some() {
        tracing::info!("answered from the inbox (the key had run before: its write was refused)");
    }
    Ok(answer)
}

/// Saves a deterministic rejection under the key, so a repeat gets the same answer instead
/// of being judged again.
pub async fn save_rejection(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    request: Request<'_>,
    rejection: SavedOutcome,
) -> Result<Answer, Error> {
    let saved_at = now();
    let txn = begin_write(db).await?;
    match entry(request, &rejection, saved_at)?.insert(&txn).await {
        Ok(_) => {
            txn.commit().await?;
            answers.remember(request, &rejection, saved_at);
            Ok(Answer {
                outcome: rejection,
                replayed: false,
            })
        }
        Err(err) if is_unique_violation(&err) => {
            drop(txn);
            // Another request with this key saved its answer first: give that one.
            replay(db, answers, request, Mode::Execute)
                .await?
                .ok_or(Error::Db(err))
        }
        Err(err) => Err(err.into()),
    }
}
