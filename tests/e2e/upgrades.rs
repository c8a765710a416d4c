//! Migrations applied to a database that already holds rows written by the previous
//! version: what those rows become.

use sea_orm::{
    ConnectionTrait, EntityTrait, TransactionTrait,
    sea_query::{Alias, Query},
};
use sea_orm_migration::MigratorTrait;
use student_store::entity::{outbox, students};
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{Backend, TestDatabases},
};

on_both_backends!(rows_written_before_the_lifecycle_migrations_keep_their_meaning);

/// The Student DB's migrations up to (and including) the fifth, the schema before
/// `error_code` and student versions existed.
const BEFORE: u32 = 5;

async fn rows_written_before_the_lifecycle_migrations_keep_their_meaning(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let db = platform::db::connect(&dbs.student_url)
        .await
        .expect("connect");
    // In one transaction, as the services apply migrations (on SQLite the schema changes
    // must not be spread over the pool's connections).
    let txn = db.begin().await.expect("begin");
    migrations::student::Migrator::up(&txn, Some(BEFORE))
        .await
        .expect("the older schema");
    txn.commit().await.expect("commit");
    let (linked, exhausted) = (Uuid::now_v7(), Uuid::now_v7());
    let at = platform::db::now();
    for (id, user) in [(linked, Some(Uuid::now_v7())), (exhausted, None)] {
        let insert = Query::insert()
            .into_table(Alias::new("students"))
            .columns(
                [
                    "id",
                    "first_name",
                    "last_name",
                    "email",
                    "document_number",
                    "user_id",
                    "request_hash",
                    "created_at",
                    "updated_at",
                ]
                .map(Alias::new),
            )
            .values_panic([
                id.into(),
                "Ana".into(),
                "Pérez".into(),
                "ana@example.edu".into(),
                id.simple().to_string()[20..].to_owned().into(),
                user.into(),
                "hash".into(),
                at.into(),
                at.into(),
            ])
            .to_owned();
        db.execute(&insert).await.expect("an old student");
    }
    let old_rows = [
        (linked, "done", None, None),
        (
            exhausted,
            "failed",
            Some("EXHAUSTED after 3 attempts, last UNAVAILABLE: connection refused"),
            Some("exhausted"),
        ),
    ];
    for (student, status, last_error, failure_kind) in old_rows {
        let insert = Query::insert()
            .into_table(Alias::new("outbox"))
            .columns(
                [
                    "aggregate_id",
                    "effect_type",
                    "payload",
                    "idempotency_key",
                    "status",
                    "attempts",
                    "last_error",
                    "available_at",
                    "created_at",
                    "failure_kind",
                ]
                .map(Alias::new),
            )
            .values_panic([
                student.into(),
                "create-user".into(),
                serde_json::json!({ "version": 1 }).into(),
                Uuid::new_v4().to_string().into(),
                status.into(),
                3.into(),
                last_error.map(str::to_owned).into(),
                at.into(),
                at.into(),
                failure_kind.map(str::to_owned).into(),
            ])
            .to_owned();
        db.execute(&insert).await.expect("an old outbox row");
    }

    // What a service does on start-up.
    migrations::apply::<migrations::student::Migrator>(&db, migrations::STUDENT_LOCK_ID)
        .await
        .expect("the current schema");

    let students = students::Entity::find().all(&db).await.expect("students");
    let of = |id: Uuid| {
        students
            .iter()
            .find(|s| s.id == id)
            .map(|s| (s.version, s.synced_version, s.active))
            .expect("student")
    };
    assert_eq!(
        of(linked),
        (1, 1, true),
        "a linked student is synced at version 1"
    );
    assert_eq!(of(exhausted), (1, 0, true));
    let rows = outbox::Entity::find().all(&db).await.expect("outbox");
    let failed = rows
        .iter()
        .find(|row| row.aggregate_id == exhausted)
        .expect("row");
    assert_eq!(
        (
            failed.aggregate_version,
            failed.error_code.as_deref(),
            failed.last_error.as_deref()
        ),
        (1, Some("UNAVAILABLE"), Some("connection refused")),
        "the old REASON: message text is split, once"
    );
    db.close().await.ok();
}
