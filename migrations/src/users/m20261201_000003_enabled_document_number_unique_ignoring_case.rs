use sea_orm_migration::prelude::*;

/// At most one *enabled* user per document number *ignoring case*, the same rule as the
/// Student DB's: the number is stored as sent, the partial unique index is on its
/// upper-cased form. Fails if two enabled users hold numbers that differ only in case:
/// disable one first.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX users_enabled_document_number_key")
            .await?;
        db.execute_unprepared(
            "CREATE UNIQUE INDEX users_enabled_document_number_key \
             ON users (UPPER(document_number)) WHERE enabled = TRUE",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX users_enabled_document_number_key")
            .await?;
        db.execute_unprepared(
            "CREATE UNIQUE INDEX users_enabled_document_number_key \
             ON users (document_number) WHERE enabled = TRUE",
        )
        .await?;
        Ok(())
    }
}
