use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

/// On PostgreSQL a new outbox row's `available_at` comes from the database's clock (a
/// column default of `now()`), the clock the relays' claims compare it with: a student-svc
/// host whose clock runs ahead can no longer hold back its own rows. SQLite has one machine
/// and one clock; nothing changes there.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE outbox ALTER COLUMN available_at SET DEFAULT now()")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE outbox ALTER COLUMN available_at DROP DEFAULT")
            .await?;
        Ok(())
    }
}
