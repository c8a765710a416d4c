use sea_orm_migration::prelude::*;

/// `outbox.traceparent`: the W3C trace context of the request that decided the row, so the
/// relay's delivery and Users' execution log under the same `trace_id` as the Student call.
/// Rows written before it have none; the relay starts a trace for them.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .add_column(ColumnDef::new(Outbox::Traceparent).string_len(55).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .drop_column(Outbox::Traceparent)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Traceparent,
}
