use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Outbox::Table)
                    .col(
                        ColumnDef::new(Outbox::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Outbox::AggregateId).uuid().not_null())
                    .col(ColumnDef::new(Outbox::EffectType).string_len(32).not_null())
                    .col(ColumnDef::new(Outbox::Payload).json().not_null())
                    // Fixed when the row is written and sent on every attempt: it is what
                    // lets Users recognise a redelivery.
                    .col(
                        ColumnDef::new(Outbox::IdempotencyKey)
                            .string_len(128)
                            .not_null()
                            .unique_key(),
                    )
                    .col(ColumnDef::new(Outbox::Status).string_len(16).not_null())
                    .col(
                        ColumnDef::new(Outbox::Attempts)
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .col(ColumnDef::new(Outbox::LastError).text().null())
                    .col(
                        ColumnDef::new(Outbox::AvailableAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Outbox::LockedUntil)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(ColumnDef::new(Outbox::LockedBy).string_len(128).null())
                    .col(
                        ColumnDef::new(Outbox::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Outbox::ProcessedAt)
                            .timestamp_with_time_zone()
                            .null(),
                    )
                    .col(ColumnDef::new(Outbox::Result).string_len(64).null())
                    .to_owned(),
            )
            .await?;
        // One create-user intention per student, whatever happens.
        manager
            .create_index(
                Index::create()
                    .name("outbox_aggregate_effect_key")
                    .table(Outbox::Table)
                    .col(Outbox::AggregateId)
                    .col(Outbox::EffectType)
                    .unique()
                    .to_owned(),
            )
            .await?;
        // Serves the claim: due rows of one status, oldest first.
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

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Outbox::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Id,
    AggregateId,
    EffectType,
    Payload,
    IdempotencyKey,
    Status,
    Attempts,
    LastError,
    AvailableAt,
    LockedUntil,
    LockedBy,
    CreatedAt,
    ProcessedAt,
    Result,
}
