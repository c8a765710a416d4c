use sea_orm_migration::prelude::*;

/// An index that matches the claim: the rows a claim can take (`pending` or `processing`),
/// in `id` order. Without it a claim walks past every `done` row in `id` order, so its cost
/// grew with the history; with it, it grows only with the rows still to deliver.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // 'pending' and 'processing' as the entity spells them (OutboxStatus); a migration
        // is frozen history, so it cannot borrow the entity's values.
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX outbox_claimable ON outbox (id) \
                 WHERE status IN ('pending', 'processing')",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX outbox_claimable")
            .await?;
        Ok(())
    }
}
