//! `users`: login users.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "users")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    pub email: String,
    pub first_name: String,
    pub last_name: String,
    /// At most one *enabled* user per document number (a partial unique index).
    pub document_number: String,
    pub student_id: Uuid,
    pub enabled: bool,
    pub created_at: DateTimeUtc,
    /// The version of its student this user reflects; a change with a version no higher
    /// than this one is not applied.
    pub source_version: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
