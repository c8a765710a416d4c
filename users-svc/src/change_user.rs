//! UpdateUser and DisableUser: a student's change reaching its user, once per idempotency
//! key (the inbox, exactly as for CreateUser) and never out of order (the version guard).
//!
//! Users keeps, per user, the version of its student it reflects (`source_version`). A
//! change applies only if it carries a higher version; an older or equal one is answered
//! `applied=false` and that answer is saved like any other, so a stale change can never
//! overwrite a newer one, whatever order deliveries arrive in.

use platform::{
    db::{begin_write, is_unique_violation, now},
    failpoint,
    fingerprint::Fingerprint,
    redact, validate,
};
use proto::users::v1::{DisableUserRequest, UpdateUserRequest};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use uuid::Uuid;

use crate::{
    answer_cache::AnswerCache,
    entity::{inbox::SavedOutcome, users},
    error::Error,
    inbox::{self, Answer, Mode},
};

/// A valid UpdateUser or DisableUser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserChange {
    pub idempotency_key: String,
    pub student_id: Uuid,
    /// The user to change, when the caller names it (the one its student is linked to);
    /// else the student's first user. Not part of the fingerprint ([`Self::request_hash`]).
    pub user_id: Option<Uuid>,
    pub source_version: i64,
    pub change: Change,
}

/// What changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Update {
        first_name: String,
        last_name: String,
        email: String,
    },
    Disable,
}

impl TryFrom<UpdateUserRequest> for UserChange {
    type Error = Error;

    fn try_from(request: UpdateUserRequest) -> Result<Self, Error> {
        validate::idempotency_key("idempotency_key", &request.idempotency_key)?;
        let student_id = validate::uuid("student_id", &request.student_id)?;
        validate::name("first_name", &request.first_name)?;
        validate::name("last_name", &request.last_name)?;
        validate::email("email", &request.email)?;
        Ok(Self {
            idempotency_key: request.idempotency_key,
            student_id,
            user_id: user_id(&request.user_id)?,
            source_version: source_version(request.source_version)?,
            change: Change::Update {
                first_name: request.first_name,
                last_name: request.last_name,
                email: request.email,
            },
        })
    }
}

impl TryFrom<DisableUserRequest> for UserChange {
    type Error = Error;

    fn try_from(request: DisableUserRequest) -> Result<Self, Error> {
        validate::idempotency_key("idempotency_key", &request.idempotency_key)?;
        let student_id = validate::uuid("student_id", &request.student_id)?;
        Ok(Self {
            idempotency_key: request.idempotency_key,
            student_id,
            user_id: user_id(&request.user_id)?,
            source_version: source_version(request.source_version)?,
            change: Change::Disable,
        })
    }
}

/// The user a change names: none when `value` is empty.
fn user_id(value: &str) -> Result<Option<Uuid>, validate::FieldViolation> {
    match value {
        "" => Ok(None),
        value => validate::uuid("user_id", value).map(Some),
    }
}

/// A student version: 2 or more (version 1 is the one the user was created with).
fn source_version(value: u64) -> Result<i64, validate::FieldViolation> {
    match i64::try_from(value) {
        Ok(version) if version >= 2 => Ok(version),
        _ => Err(validate::FieldViolation::new(
            "source_version",
            "must be a student version of 2 or more",
        )),
    }
}

impl UserChange {
    /// The request's fingerprint: a tag naming the RPC, then its fields in a fixed order
    /// (`student_id` as a lowercase hyphenated UUID, `source_version` in decimal). The tag
    /// keeps one key sent to two RPCs from ever looking like the same request. `user_id`
    /// is left out: it says where the change goes, not what it is, and a key stored before
    /// callers named it must still be the same request when sent again naming it.
    pub fn request_hash(&self) -> String {
        let fingerprint = match &self.change {
            Change::Update {
                first_name,
                last_name,
                email,
            } => Fingerprint::new()
                .field("update-user")
                .field(&self.student_id.hyphenated().to_string())
                .field(first_name)
                .field(last_name)
                .field(email),
            Change::Disable => Fingerprint::new()
                .field("disable-user")
                .field(&self.student_id.hyphenated().to_string()),
        };
        fingerprint.field(&self.source_version.to_string()).finish()
    }
}

/// Applies `change` once per idempotency key, or answers with what its key already got.
#[tracing::instrument(skip_all, fields(idempotency_key = %change.idempotency_key, student_id = %change.student_id, source_version = change.source_version), err(level = "debug"))]
pub async fn change_user(
    db: &DatabaseConnection,
    answers: &AnswerCache,
    change: UserChange,
    mode: Mode,
) -> Result<Answer, Error> {
    let request_hash = change.request_hash();
    let request = inbox::Request {
        key: &change.idempotency_key,
        request_hash: &request_hash,
    };
    if let Some(answer) = inbox::replay(db, answers, request, mode).await? {
        tracing::info!("answered from the inbox");
        return Ok(answer);
    }
    let saved_at = now();
    match apply_with_inbox(db, &change, request, saved_at).await {
        Ok(outcome) => {
            answers.remember(request, &outcome, saved_at);
            Ok(Answer {
                outcome,
                replayed: false,
            })
        }
        Err(Error::Db(err)) if is_unique_violation(&err) => {
            // Only the inbox key is unique here (a change never touches the document
            // number): a concurrent delivery of this key won the race.
            inbox::after_unique_violation(db, answers, request)
                .await?
                .ok_or(Error::Db(err))
        }
        Err(err) => Err(err),
    }
}

/// The one transaction that executes a change: the user (if the change is newer than what
/// it reflects) and the inbox row with the answer (saved at `saved_at`), together.
async fn apply_with_inbox(
    db: &DatabaseConnection,
    change: &UserChange,
    request: inbox::Request<'_>,
    saved_at: chrono::DateTime<chrono::Utc>,
) -> Result<SavedOutcome, Error> {
    let txn = begin_write(db).await?;
    // The user the change names, or else the student's first: locked, so concurrent
    // changes of one user are judged one after the other.
    let user = match change.user_id {
        Some(user_id) => {
            let user = users::Entity::find_by_id(user_id)
                .lock_exclusive()
                .one(&txn)
                .await?
                .ok_or(Error::NotFound(user_id))?;
            if user.student_id != change.student_id {
                return Err(Error::UserOfAnotherStudent {
                    user_id,
                    student_id: change.student_id,
                });
            }
            user
        }
        None => users::Entity::find()
            .filter(users::Column::StudentId.eq(change.student_id))
            .order_by_asc(users::Column::CreatedAt)
            .order_by_asc(users::Column::Id)
            .lock_exclusive()
            .one(&txn)
            .await?
            .ok_or(Error::NoUserForStudent(change.student_id))?,
    };
    let applied = change.source_version > user.source_version;
    if applied {
        let mut updated = users::ActiveModel {
            id: Set(user.id),
            source_version: Set(change.source_version),
            ..Default::default()
        };
        match &change.change {
            Change::Update {
                first_name,
                last_name,
                email,
            } => {
                updated.first_name = Set(first_name.clone());
                updated.last_name = Set(last_name.clone());
                updated.email = Set(email.clone());
            }
            Change::Disable => updated.enabled = Set(false),
        }
        updated.update(&txn).await?;
    }
    let outcome = SavedOutcome::Applied {
        user_id: user.id,
        applied,
    };
    inbox::entry(request, &outcome, saved_at)?
        .insert(&txn)
        .await?;
    failpoint::hit(failpoint::points::USERS_BEFORE_COMMIT).await;
    // Crash point: before this commit nothing changed; after it, the user reflects the
    // change and the inbox holds the answer any redelivery of this key will get.
    txn.commit().await?;
    failpoint::hit(failpoint::points::USERS_AFTER_COMMIT).await;
    match (&change.change, applied) {
        (Change::Update { email, .. }, true) => tracing::info!(
            user_id = %user.id,
            email = %redact::email(email),
            "user updated"
        ),
        (Change::Disable, true) => tracing::info!(user_id = %user.id, "user disabled"),
        (_, false) => tracing::info!(
            user_id = %user.id,
            reflects = user.source_version,
            "not applied: the user already reflects this version or a newer one"
        ),
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update() -> UpdateUserRequest {
        UpdateUserRequest {
            idempotency_key: "k-1".into(),
            student_id: "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a".into(),
            first_name: "Ana".into(),
            last_name: "Gómez".into(),
            email: "ana.gomez@example.edu".into(),
            source_version: 2,
            user_id: String::new(),
        }
    }

    #[test]
    fn the_fingerprint_covers_every_field_and_the_rpc_but_not_the_key() {
        let base = UserChange::try_from(update()).expect("valid");
        let other_key = UserChange::try_from(UpdateUserRequest {
            idempotency_key: "k-2".into(),
            ..update()
        })
        .expect("valid");
        assert_eq!(base.request_hash(), other_key.request_hash());
        let newer = UserChange::try_from(UpdateUserRequest {
            source_version: 3,
            ..update()
        })
        .expect("valid");
        assert_ne!(base.request_hash(), newer.request_hash());
        let disable = UserChange::try_from(DisableUserRequest {
            idempotency_key: "k-1".into(),
            student_id: update().student_id,
            source_version: 2,
            user_id: String::new(),
        })
        .expect("valid");
        assert_ne!(base.request_hash(), disable.request_hash());
    }

    /// The layouts the README documents, field by field; a reordered field or a renamed
    /// tag would make every stored fingerprint look like another request after an upgrade.
    #[test]
    fn the_fingerprints_are_the_documented_layouts() {
        let student_id = "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a";
        let update = UserChange::try_from(update()).expect("valid");
        assert_eq!(
            update.request_hash(),
            Fingerprint::of(&[
                "update-user",
                student_id,
                "Ana",
                "Gómez",
                "ana.gomez@example.edu",
                "2"
            ])
        );
        let disable = UserChange::try_from(DisableUserRequest {
            idempotency_key: "k-1".into(),
            student_id: student_id.to_uppercase(),
            source_version: 12,
            user_id: String::new(),
        })
        .expect("valid");
        assert_eq!(
            disable.request_hash(),
            Fingerprint::of(&["disable-user", student_id, "12"])
        );
    }

    #[test]
    fn version_one_and_below_are_named() {
        for version in [0, 1, u64::MAX] {
            match UserChange::try_from(UpdateUserRequest {
                source_version: version,
                ..update()
            }) {
                Err(Error::InvalidArgument(violation)) => {
                    assert_eq!(violation.field, "source_version")
                }
                other => panic!("expected a source_version violation, got {other:?}"),
            }
        }
    }
}
