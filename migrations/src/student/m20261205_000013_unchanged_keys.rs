use sea_orm_migration::prelude::*;

/// `unchanged_keys`: the client key of every UpdateStudent or DeactivateStudent that
/// changed nothing (the values it sent were already the student's, or the student was
/// already inactive). Such a call writes no version and no outbox row, where a change's key
/// lives, so its key had nowhere to be kept: a retry after another client's change then
/// applied the call's values over the newer ones, and the key could be reused for another
/// request unnoticed. Kept as long as a `done` outbox row (`relay purge`), by `created_at`.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(UnchangedKeys::Table)
                    .col(
                        ColumnDef::new(UnchangedKeys::ClientKey)
                            .string_len(128)
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(UnchangedKeys::StudentId).uuid().not_null())
                    .col(
                        ColumnDef::new(UnchangedKeys::RequestHash)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(UnchangedKeys::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("unchanged_keys_created_at")
                    .table(UnchangedKeys::Table)
                    .col(UnchangedKeys::CreatedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(UnchangedKeys::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum UnchangedKeys {
    Table,
    ClientKey,
    StudentId,
    RequestHash,
    CreatedAt,
}
