use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Users::Table)
                    .col(ColumnDef::new(Users::Id).uuid().not_null().primary_key())
                    .col(ColumnDef::new(Users::Email).string_len(254).not_null())
                    .col(ColumnDef::new(Users::FirstName).string_len(100).not_null())
                    .col(ColumnDef::new(Users::LastName).string_len(100).not_null())
                    .col(
                        ColumnDef::new(Users::DocumentNumber)
                            .string_len(32)
                            .not_null(),
                    )
                    .col(ColumnDef::new(Users::StudentId).uuid().not_null())
                    .col(
                        ColumnDef::new(Users::Enabled)
                            .boolean()
                            .not_null()
                            .default(true),
                    )
                    .col(
                        ColumnDef::new(Users::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        // Domain rule, independent of the inbox: at most one enabled user per document
        // number. Disabled users may share it.
        manager
            .create_index(
                Index::create()
                    .name("users_enabled_document_number_key")
                    .table(Users::Table)
                    .col(Users::DocumentNumber)
                    .unique()
                    .and_where(Expr::col(Users::Enabled).eq(true))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("users_student_id_idx")
                    .table(Users::Table)
                    .col(Users::StudentId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Users::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Email,
    FirstName,
    LastName,
    DocumentNumber,
    StudentId,
    Enabled,
    CreatedAt,
}
