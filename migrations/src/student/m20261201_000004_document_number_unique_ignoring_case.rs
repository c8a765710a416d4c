use sea_orm_migration::prelude::*;

/// One student per document number *ignoring case*: `ab-1001` and `AB-1001` name the same
/// document. The number is stored as sent; the unique index is on its upper-cased form
/// (document numbers are ASCII, so `UPPER` is exact on both backends). Fails if the table
/// already holds two numbers that differ only in case: resolve those first.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX students_document_number_key")
            .await?;
        db.execute_unprepared(
            "CREATE UNIQUE INDEX students_document_number_key ON students (UPPER(document_number))",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX students_document_number_key")
            .await?;
        db.execute_unprepared(
            "CREATE UNIQUE INDEX students_document_number_key ON students (document_number)",
        )
        .await?;
        Ok(())
    }
}
