//! `inbox`: one row per idempotency key already executed, with the answer it got.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "inbox")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub idempotency_key: String,
    /// Fingerprint of the request first executed under this key.
    pub request_hash: String,
    /// The saved answer, a [`SavedOutcome`] as JSON.
    #[sea_orm(
        column_type = "Json",
        column_name = "result",
        enum_name = "SavedResult"
    )]
    pub result: Json,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// What the first execution under a key answered; every repeat gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SavedOutcome {
    /// The user was created.
    Created { user_id: Uuid },
    /// An update or a disable ran: on this user, changing it (`applied`) or not (it
    /// already reflected this version of its student or a newer one).
    Applied { user_id: Uuid, applied: bool },
    /// A domain rule rejected the request: a gRPC code, a stable reason, a message.
    Rejected {
        code: i32,
        reason: String,
        message: String,
    },
}
