//! `unchanged_keys`: the client key of each UpdateStudent or DeactivateStudent that changed
//! nothing, so that its retries are recognised as such (a change's key lives on its outbox
//! row; a call that changed nothing writes none).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "unchanged_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub client_key: String,
    pub student_id: Uuid,
    /// Fingerprint of the call, to tell a retry from a key reused.
    pub request_hash: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
