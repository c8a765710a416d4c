use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Inbox::Table)
                    // The key is the primary key: of two racing first deliveries, exactly
                    // one insert succeeds and the other reads the saved result.
                    .col(
                        ColumnDef::new(Inbox::IdempotencyKey)
                            .string_len(128)
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Inbox::RequestHash).string_len(64).not_null())
                    .col(ColumnDef::new(Inbox::Result).json().not_null())
                    .col(
                        ColumnDef::new(Inbox::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Inbox::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Inbox {
    Table,
    IdempotencyKey,
    RequestHash,
    Result,
    CreatedAt,
}
