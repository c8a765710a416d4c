use sea_orm_migration::prelude::*;

/// Drops `outbox_claim_idx` (`status`, `available_at`, `id`), which nothing reads any more:
/// the claim goes through `outbox_claimable` (since `m20261201_000008`), failed rows through
/// `outbox_failed`, done rows through `outbox_done_by_time`. Every row changes `status`
/// twice on its way to `done` (claimed, finished), and each change wrote a new entry into
/// this index too.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("outbox_claim_idx")
                    .table(Outbox::Table)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name("outbox_claim_idx")
                    .table(Outbox::Table)
                    .col(Outbox::Status)
                    .col(Outbox::AvailableAt)
                    .col(Outbox::Id)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Status,
    AvailableAt,
    Id,
}
