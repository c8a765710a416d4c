use sea_orm_migration::prelude::*;

/// The inbox by age, so the retention purge finds expired keys, and sees at once that
/// there are none, without reading the whole inbox.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE INDEX inbox_created_at ON inbox (created_at, idempotency_key)",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("DROP INDEX inbox_created_at")
            .await?;
        Ok(())
    }
}
