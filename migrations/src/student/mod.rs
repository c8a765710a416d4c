//! The Student DB: `students`, the `outbox` of effects still to deliver, and the
//! `unchanged_keys` of changes that changed nothing.

use sea_orm_migration::prelude::*;

mod m20261130_000001_create_students_table;
mod m20261130_000002_create_outbox_table;
mod m20261130_000003_add_outbox_failure_kind;
mod m20261201_000004_document_number_unique_ignoring_case;
mod m20261201_000005_outbox_available_at_from_database_clock;
mod m20261201_000006_outbox_error_code;
mod m20261201_000007_student_versions;
mod m20261201_000008_outbox_claimable_index;
mod m20261201_000009_outbox_retention_indexes;
mod m20261201_000010_outbox_key_created_at;
mod m20261201_000011_outbox_traceparent;
mod m20261201_000012_drop_outbox_claim_idx;
mod m20261205_000013_unchanged_keys;

/// Migrates the Student DB.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_students_table::Migration),
            Box::new(m20261130_000002_create_outbox_table::Migration),
            Box::new(m20261130_000003_add_outbox_failure_kind::Migration),
            Box::new(m20261201_000004_document_number_unique_ignoring_case::Migration),
            Box::new(m20261201_000005_outbox_available_at_from_database_clock::Migration),
            Box::new(m20261201_000006_outbox_error_code::Migration),
            Box::new(m20261201_000007_student_versions::Migration),
            Box::new(m20261201_000008_outbox_claimable_index::Migration),
            Box::new(m20261201_000009_outbox_retention_indexes::Migration),
            Box::new(m20261201_000010_outbox_key_created_at::Migration),
            Box::new(m20261201_000011_outbox_traceparent::Migration),
            Box::new(m20261201_000012_drop_outbox_claim_idx::Migration),
            Box::new(m20261205_000013_unchanged_keys::Migration),
        ]
    }
}
