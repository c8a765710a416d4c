//! A commit the database refuses, on demand: the way to show what a service does when its
//! transaction fails after its statements passed.

use sea_orm::ConnectionTrait as _;

use super::Backend;

/// Makes every commit that would keep an inbox row for `key` (any key: `None`) fail, after
/// its insert passed: a constraint the database checks only at commit (a deferred trigger
/// on PostgreSQL, a deferred foreign key to a missing row on SQLite).
pub async fn refuse_to_commit_inbox_rows(
    db: &sea_orm::DatabaseConnection,
    backend: Backend,
    key: Option<&str>,
) {
    let statements = match backend {
        Backend::Postgres => vec![
            "CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'the test refuses this commit'; END $$"
                .to_owned(),
            format!(
                "CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON inbox \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW {} \
                 EXECUTE FUNCTION refuse_commit()",
                key.map(|key| format!("WHEN (NEW.idempotency_key = '{key}')"))
                    .unwrap_or_default()
            ),
        ],
        Backend::Sqlite => vec![
            "CREATE TABLE commit_allowed (id TEXT PRIMARY KEY)".to_owned(),
            "ALTER TABLE inbox ADD COLUMN commit_allowed_id TEXT \
             REFERENCES commit_allowed (id) DEFERRABLE INITIALLY DEFERRED"
                .to_owned(),
            format!(
                "CREATE TRIGGER refuse_commit AFTER INSERT ON inbox \
                 WHEN {} BEGIN \
                 UPDATE inbox SET commit_allowed_id = 'never' \
                 WHERE idempotency_key = NEW.idempotency_key; END",
                key.map_or_else(
                    || "1".to_owned(),
                    |key| format!("NEW.idempotency_key = '{key}'")
                )
            ),
        ],
    };
    for statement in statements {
        db.execute_unprepared(&statement)
            .await
            .expect("install the commit trap");
    }
}

/// Undoes [`refuse_to_commit_inbox_rows`]: commits pass again.
pub async fn lift_the_commit_trap(db: &sea_orm::DatabaseConnection, backend: Backend) {
    let lift = match backend {
        Backend::Postgres => "DROP TRIGGER refuse_commit ON inbox",
        Backend::Sqlite => "DROP TRIGGER refuse_commit",
    };
    db.execute_unprepared(lift)
        .await
        .expect("lift the commit trap");
}
