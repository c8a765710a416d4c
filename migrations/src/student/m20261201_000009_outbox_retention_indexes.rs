use sea_orm_migration::prelude::*;

/// Indexes that keep day-two reads cheap however long the history grows:
/// - `outbox_failed`: the `failed` rows (counted by the metrics gauge and `relay status`,
///   listed by `retry-failed`) without walking the `done` ones;
/// - `outbox_done_by_time`: `done` rows by when they were done, so a retention purge finds
///   the expired ones, and sees at once that there are none, without a scan.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Statuses as the entity spells them (OutboxStatus); a migration is frozen history,
        // so it cannot borrow the entity's values.
        let db = manager.get_connection();
        db.execute_unprepared("CREATE INDEX outbox_failed ON outbox (id) WHERE status = 'failed'")
            .await?;
        db.execute_unprepared(
            "CREATE INDEX outbox_done_by_time ON outbox (processed_at, id) \
             WHERE status = 'done'",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX outbox_done_by_time")
            .await?;
        db.execute_unprepared("DROP INDEX outbox_failed").await?;
        Ok(())
    }
}
