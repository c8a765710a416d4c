use sea_orm_migration::{
    prelude::*,
    sea_orm::{ConnectionTrait, Statement},
};

/// Stores the stable reason of a row's last error apart from its message (`error_code`
/// beside `last_error`), so that what clients see is computed from structured data, never
/// parsed back out of a `REASON: message` string.
///
/// Rows written before it hold `REASON: message` (or `EXHAUSTED after N attempts, last
/// REASON: message`) in `last_error`: this migration splits them, once, here.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .add_column(ColumnDef::new(Outbox::ErrorCode).string_len(64).null())
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        let backend = db.get_database_backend();
        let rows = db
            .query_all_raw(Statement::from_string(
                backend,
                "SELECT id, last_error FROM outbox WHERE last_error IS NOT NULL",
            ))
            .await?;
        for row in rows {
            let id: i64 = row.try_get("", "id")?;
            let last_error: String = row.try_get("", "last_error")?;
            let Some((code, message)) = split(&last_error) else {
                continue;
            };
            let update = Query::update()
                .table(Outbox::Table)
                .value(Outbox::ErrorCode, code)
                .value(Outbox::LastError, message)
                .and_where(Expr::col(Outbox::Id).eq(id))
                .to_owned();
            db.execute(&update).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Outbox::Table)
                    .drop_column(Outbox::ErrorCode)
                    .to_owned(),
            )
            .await
    }
}

/// `REASON: message` → (`REASON`, `message`), past an `EXHAUSTED after N attempts, last `
/// prefix; `None` for text of another shape, which is left as it is.
fn split(last_error: &str) -> Option<(&str, &str)> {
    let text = match last_error.strip_prefix("EXHAUSTED after ") {
        Some(rest) => rest.split_once(", last ")?.1,
        None => last_error,
    };
    let (code, message) = text.split_once(": ")?;
    let is_reason = !code.is_empty()
        && code
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    is_reason.then_some((code, message))
}

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Id,
    LastError,
    ErrorCode,
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn old_error_texts_split_into_reason_and_message() {
        assert_eq!(
            split("DOCUMENT_NUMBER_TAKEN: document_number is already used"),
            Some(("DOCUMENT_NUMBER_TAKEN", "document_number is already used"))
        );
        assert_eq!(
            split("EXHAUSTED after 100 attempts, last UNAVAILABLE: connection refused"),
            Some(("UNAVAILABLE", "connection refused"))
        );
        assert_eq!(split("something else: entirely"), None);
    }
}
