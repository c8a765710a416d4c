use sea_orm_migration::prelude::*;

/// Students change after they are created, and every accepted change reaches Users in
/// order:
/// - `students.version` (1 at creation, +1 per accepted change), `synced_version` (the
///   highest version Users has applied; existing linked students start at 1) and `active`.
/// - `outbox.aggregate_version`: the student version an effect carries. One row per
///   student version replaces one row per (student, effect type), since a student now has
///   many `update-user` rows.
/// - `outbox.client_key` and `request_hash`: the caller's key of the UpdateStudent or
///   DeactivateStudent that decided the row, to answer its retries.
/// - An index of each student's unfinished rows by version, for the claim's "every earlier
///   row of this student is done" check.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            ColumnDef::new(Students::Version)
                .big_integer()
                .not_null()
                .default(1)
                .to_owned(),
            ColumnDef::new(Students::SyncedVersion)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned(),
            ColumnDef::new(Students::Active)
                .boolean()
                .not_null()
                .default(true)
                .to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Students::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        let db = manager.get_connection();
        db.execute_unprepared("UPDATE students SET synced_version = 1 WHERE user_id IS NOT NULL")
            .await?;

        for column in [
            ColumnDef::new(Outbox::AggregateVersion)
                .big_integer()
                .not_null()
                .default(1)
                .to_owned(),
            ColumnDef::new(Outbox::ClientKey)
                .string_len(128)
                .null()
                .to_owned(),
            ColumnDef::new(Outbox::RequestHash)
                .string_len(64)
                .null()
                .to_owned(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Outbox::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_index(
                Index::drop()
                    .name("outbox_aggregate_effect_key")
                    .table(Outbox::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("outbox_aggregate_version_key")
                    .table(Outbox::Table)
                    .col(Outbox::AggregateId)
                    .col(Outbox::AggregateVersion)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("outbox_client_key_key")
                    .table(Outbox::Table)
                    .col(Outbox::ClientKey)
                    .unique()
                    .to_owned(),
            )
            .await?;
        // 'done' as the entity spells it (OutboxStatus::Done); a migration is frozen
        // history, so it cannot borrow the entity's value.
        db.execute_unprepared(
            "CREATE INDEX outbox_unfinished_by_student \
             ON outbox (aggregate_id, aggregate_version) WHERE status <> 'done'",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("DROP INDEX outbox_unfinished_by_student")
            .await?;
        for name in ["outbox_client_key_key", "outbox_aggregate_version_key"] {
            manager
                .drop_index(Index::drop().name(name).table(Outbox::Table).to_owned())
                .await?;
        }
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
        for column in [
            Outbox::AggregateVersion,
            Outbox::ClientKey,
            Outbox::RequestHash,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Outbox::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        for column in [Students::Version, Students::SyncedVersion, Students::Active] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Students::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Students {
    Table,
    Version,
    SyncedVersion,
    Active,
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    EffectType,
    AggregateId,
    AggregateVersion,
    ClientKey,
    RequestHash,
}
