//! `students`: one row per student.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "students")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub first_name: String,
    pub last_name: String,
    pub email: String,
    pub document_number: String,
    /// The login user in Users; `None` until the relay links it.
    pub user_id: Option<Uuid>,
    /// The caller's own CreateStudent key, if it sent one.
    pub client_key: Option<String>,
    /// Fingerprint of the CreateStudent fields, to tell a retry from a key reused.
    pub request_hash: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// 1 at creation, +1 per accepted change; each change's outbox row carries it.
    pub version: i64,
    /// The highest version Users has applied (equal to `version` when Users is up to date).
    pub synced_version: i64,
    /// False once deactivated; an inactive student accepts no change.
    pub active: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
