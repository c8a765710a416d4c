//! `outbox`: effects on other services that a Student transaction decided on, waiting for
//! the relay to deliver them. Status values are spelled here and nowhere else: raw SQL
//! builds its literals from [`OutboxStatus`].

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "outbox")]
pub struct Model {
    /// Claim order only: ids are not assigned in commit order on PostgreSQL, so this is
    /// never used as a cursor.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The student the effect belongs to.
    pub aggregate_id: Uuid,
    /// The student's version this effect carries: a student's rows are delivered in this
    /// order, each only once every earlier one is `done`.
    pub aggregate_version: i64,
    /// Which effect this is; with `payload` it decodes into an [`crate::effect::Effect`].
    pub effect_type: String,
    /// What Users needs, as decided at commit time, with a `version` of its format.
    #[sea_orm(column_type = "Json")]
    pub payload: Json,
    /// Generated once, with the row, and sent on every delivery attempt.
    #[sea_orm(unique)]
    pub idempotency_key: String,
    pub status: OutboxStatus,
    pub attempts: i32,
    /// Why the last attempt did not succeed, for people: a readable message. Its stable
    /// reason is `error_code`.
    pub last_error: Option<String>,
    /// Not to be delivered before this time (retry backoff).
    pub available_at: DateTimeUtc,
    pub locked_until: Option<DateTimeUtc>,
    pub locked_by: Option<String>,
    pub created_at: DateTimeUtc,
    pub processed_at: Option<DateTimeUtc>,
    /// The user id Users returned, once delivered.
    #[sea_orm(column_name = "result", enum_name = "DeliveredUserId")]
    pub result: Option<String>,
    /// Why the row `failed`, when it did.
    pub failure_kind: Option<FailureKind>,
    /// The stable reason of `last_error`: Users' `ErrorInfo` reason
    /// (`DOCUMENT_NUMBER_TAKEN`), a gRPC code (`UNAVAILABLE`), or the relay's own
    /// (`LINK_CONFLICT`, `NOT_LINKED`, `STUDENT_MISSING`, `UNKNOWN_EFFECT`,
    /// `UNREADABLE_PAYLOAD`).
    pub error_code: Option<String>,
    /// The caller's key of the UpdateStudent or DeactivateStudent that decided this row.
    pub client_key: Option<String>,
    /// Fingerprint of that request, to tell its retry from the key reused.
    pub request_hash: Option<String>,
    /// When `idempotency_key` was issued, if later than `created_at` (a redrive with a new
    /// key). See [`Model::key_issued_at`].
    pub key_created_at: Option<DateTimeUtc>,
    /// The W3C `traceparent` of the Student call that decided the row: the relay continues
    /// that trace when it delivers the row.
    pub traceparent: Option<String>,
}

impl Model {
    /// When the row's current key was issued: sent to Users with every delivery, so that it
    /// can refuse a key older than its inbox keeps keys instead of executing it again.
    pub fn key_issued_at(&self) -> DateTimeUtc {
        self.key_created_at.unwrap_or(self.created_at)
    }

    /// What the row's effect does to Users; `None` for an effect type this code does not
    /// know (such a row fails as `UNKNOWN_EFFECT` and is never delivered).
    pub fn operation(&self) -> Option<crate::effect::Operation> {
        crate::effect::EffectType::parse(&self.effect_type)
            .map(crate::effect::EffectType::operation)
    }
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Where a row is in its life: `pending` → (`processing`) → `done` or `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum OutboxStatus {
    /// Waiting for delivery (possibly after a transient failure, see `available_at`).
    #[sea_orm(string_value = "pending")]
    Pending,
    /// Claimed by a relay whose lease (`locked_until`) has not run out.
    #[sea_orm(string_value = "processing")]
    Processing,
    /// Delivered: the user exists and is linked to the student.
    #[sea_orm(string_value = "done")]
    Done,
    /// Rejected for good by Users; `last_error` says why.
    #[sea_orm(string_value = "failed")]
    Failed,
}

/// Why a row failed, which decides how it may be redriven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
pub enum FailureKind {
    /// Users rejected the request (or it can never be sent). The same key would get the
    /// same saved answer, so only a new key, explicitly a new operation, redrives it.
    #[sea_orm(string_value = "rejected")]
    Rejected,
    /// Transient failures used up every attempt. The same key may be retried as is.
    #[sea_orm(string_value = "exhausted")]
    Exhausted,
    /// Users refused the key as older than its inbox retention (`DELIVERY_EXPIRED`): it
    /// cannot tell whether the key ran, so an operator must find out before a new key.
    #[sea_orm(string_value = "expired")]
    Expired,
}
