//! The Users DB: `users` and the `inbox` of operations already executed.

use sea_orm_migration::prelude::*;

mod m20261130_000001_create_users_table;
mod m20261130_000002_create_inbox_table;
mod m20261201_000003_enabled_document_number_unique_ignoring_case;
mod m20261201_000004_user_source_version;
mod m20261201_000005_inbox_created_at_index;

/// Migrates the Users DB.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_users_table::Migration),
            Box::new(m20261130_000002_create_inbox_table::Migration),
            Box::new(m20261201_000003_enabled_document_number_unique_ignoring_case::Migration),
            Box::new(m20261201_000004_user_source_version::Migration),
            Box::new(m20261201_000005_inbox_created_at_index::Migration),
        ]
    }
}
