use sea_orm_migration::prelude::*;

/// `outbox.key_created_at`: when the row's current idempotency key was issued, if not with
/// the row (a `retry-failed --new-key` issues a new key to an old row). The relay sends it
/// to Users as `idempotency-key-created-at` for the horizon guard; a new key must not look
/// as old as its row, or Users would refuse it as expired.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .add_column(
                        ColumnDef::new(Outbox::KeyCreatedAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .drop_column(Outbox::KeyCreatedAt)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    KeyCreatedAt,
}
