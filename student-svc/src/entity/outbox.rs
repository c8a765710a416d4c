//! `outbox`: effects on other services that a Student transaction decided on, waiting for
//! the relay to deliver them.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// The effect type of the row that asks Users for a login user.
pub const CREATE_USER: &str = "create-user";

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "outbox")]
pub struct Model {
    /// Claim order only: ids are not assigned in commit order on PostgreSQL, so this is
    /// never used as a cursor.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The student the effect belongs to.
    pub aggregate_id: Uuid,
    pub effect_type: String,
    /// What Users needs, as decided at commit time ([`CreateUserPayload`]).
    #[sea_orm(column_type = "Json")]
    pub payload: Json,
    /// Generated once, with the row, and sent on every delivery attempt.
    #[sea_orm(unique)]
    pub idempotency_key: String,
    pub status: OutboxStatus,
    pub attempts: i32,
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
}

/// The `create-user` payload: a snapshot of what Users needs, taken when the student was
/// created, so every delivery attempt sends exactly the same request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateUserPayload {
    /// Payload format version, so old rows stay readable after the format changes.
    pub version: u32,
    pub email: String,
    pub first_name: String,
    pub last_name: String,
    pub document_number: String,
    pub student_id: Uuid,
}

impl CreateUserPayload {
    /// The payload format this code writes.
    pub const VERSION: u32 = 1;
}
