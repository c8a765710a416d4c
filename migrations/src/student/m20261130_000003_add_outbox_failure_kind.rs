use sea_orm_migration::prelude::*;

/// Records why a row `failed`: `rejected` (Users said no, or the row can never be sent: the
/// same key would get the same answer, so only a new key redrives it) or `exhausted`
/// (transient failures ran out of attempts: the same key may simply be retried).
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .add_column(ColumnDef::new(Outbox::FailureKind).string_len(16).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .drop_column(Outbox::FailureKind)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    FailureKind,
}
