use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Students::Table)
                    .col(ColumnDef::new(Students::Id).uuid().not_null().primary_key())
                    .col(
                        ColumnDef::new(Students::FirstName)
                            .string_len(100)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Students::LastName)
                            .string_len(100)
                            .not_null(),
                    )
                    .col(ColumnDef::new(Students::Email).string_len(254).not_null())
                    .col(
                        ColumnDef::new(Students::DocumentNumber)
                            .string_len(32)
                            .not_null(),
                    )
                    // Empty until the relay links the user created in Users.
                    .col(ColumnDef::new(Students::UserId).uuid().null())
                    // The caller's optional CreateStudent key; never the key sent to Users.
                    .col(ColumnDef::new(Students::ClientKey).string_len(128).null())
                    .col(
                        ColumnDef::new(Students::RequestHash)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Students::CreatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Students::UpdatedAt)
                            .timestamp_with_time_zone()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        // A retried CreateStudent with the same key must find the first student, and two
        // racing ones must not both insert: the unique index decides.
        manager
            .create_index(
                Index::create()
                    .name("students_client_key_key")
                    .table(Students::Table)
                    .col(Students::ClientKey)
                    .unique()
                    .to_owned(),
            )
            .await?;
        // Domain rule: one student per document number.
        manager
            .create_index(
                Index::create()
                    .name("students_document_number_key")
                    .table(Students::Table)
                    .col(Students::DocumentNumber)
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Students::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Students {
    Table,
    Id,
    FirstName,
    LastName,
    Email,
    DocumentNumber,
    UserId,
    ClientKey,
    RequestHash,
    CreatedAt,
    UpdatedAt,
}
