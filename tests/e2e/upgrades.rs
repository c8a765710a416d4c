//! Migrations applied to a database that already holds rows written by the previous
//! version: what those rows become, and what an upgrade those rows refuse leaves behind.

use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, EntityTrait, TransactionTrait,
    sea_query::{Alias, Query},
};
use sea_orm_migration::MigratorTrait;
use student_store::entity::{outbox, students};
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{Backend, TestDatabases, stack::binaries},
};

on_both_backends!(
    rows_written_before_the_lifecycle_migrations_keep_their_meaning,
    an_upgrade_the_rows_refuse_changes_nothing_until_they_are_resolved,
);

/// The Student DB's migrations up to (and including) the fifth, the schema before
/// `error_code` and student versions existed.
const BEFORE: u32 = 5;

/// The test's Student DB with its first `applied` migrations applied: the schema of an
/// earlier version. In one transaction, as the services apply migrations (on SQLite the
/// schema changes must not be spread over the pool's connections).
async fn student_db_at(dbs: &TestDatabases, applied: u32) -> DatabaseConnection {
    let db = platform::db::connect(&dbs.student_url)
        .await
        .expect("connect");
    let txn = db.begin().await.expect("begin");
    migrations::student::Migrator::up(&txn, Some(applied))
        .await
        .expect("the older schema");
    txn.commit().await.expect("commit");
    db
}

async fn rows_written_before_the_lifecycle_migrations_keep_their_meaning(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let db = student_db_at(&dbs, BEFORE).await;
    let (linked, exhausted) = (Uuid::now_v7(), Uuid::now_v7());
    for (id, user) in [(linked, Some(Uuid::now_v7())), (exhausted, None)] {
        let document_number = id.simple().to_string()[20..].to_owned();
        old_student(&db, id, &document_number, user)
            .await
            .expect("an old student");
    }
    let at = platform::db::now();
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

/// The Student DB's migrations before document numbers became unique ignoring case.
const BEFORE_CASE_INSENSITIVE: u32 = 3;

/// Writes student `id` with `document_number`, linked to `user` if given, as the old
/// schema allows.
async fn old_student(
    db: &impl ConnectionTrait,
    id: Uuid,
    document_number: &str,
    user: Option<Uuid>,
) -> Result<(), sea_orm::DbErr> {
    let at = platform::db::now();
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
            document_number.into(),
            user.into(),
            "hash".into(),
            at.into(),
            at.into(),
        ])
        .to_owned();
    db.execute(&insert).await.map(|_| ())
}

async fn applied_migrations(db: &DatabaseConnection) -> usize {
    migrations::student::Migrator::get_applied_migrations(db)
        .await
        .expect("read the applied migrations")
        .len()
}

/// README: the case-insensitive migration fails while two document numbers differ only in
/// case. The upgrade (every pending migration in one transaction, as a service applies
/// them) then changes nothing: the schema stays where it was, the old index too. Once the
/// operator resolves the pair, the same upgrade applies and the new rule holds.
async fn an_upgrade_the_rows_refuse_changes_nothing_until_they_are_resolved(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let db = student_db_at(&dbs, BEFORE_CASE_INSENSITIVE).await;
    old_student(&db, Uuid::now_v7(), "ab-1001", None)
        .await
        .expect("a student");
    old_student(&db, Uuid::now_v7(), "AB-1001", None)
        .await
        .expect("allowed by the old schema");

    // student-svc, started on it, stops with the database's refusal.
    let log = dbs.dir.path().join("student-svc.log");
    let mut service = devstack::Process::spawn_isolated(
        &binaries().join("student-svc"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &dbs.student_url,
        ]
        .map(str::to_owned),
        &[],
        &log,
    )
    .expect("start student-svc");
    let status = service
        .wait_timeout(Duration::from_secs(60))
        .expect("wait")
        .expect("student-svc stops instead of serving");
    assert!(!status.success(), "{status}");
    let logged = std::fs::read_to_string(&log).expect("its log");
    assert!(logged.contains("students_document_number_key"), "{logged}");

    let refused =
        migrations::apply::<migrations::student::Migrator>(&db, migrations::STUDENT_LOCK_ID)
            .await
            .expect_err("two numbers that differ only in case");
    // Both databases name the index they could not build.
    assert!(
        refused.to_string().contains("students_document_number_key"),
        "{refused}"
    );
    assert_eq!(
        applied_migrations(&db).await,
        BEFORE_CASE_INSENSITIVE as usize
    );
    assert!(
        old_student(&db, Uuid::now_v7(), "ab-1001", None)
            .await
            .is_err(),
        "the old index is still there"
    );
    old_student(&db, Uuid::now_v7(), "cd-2002", None)
        .await
        .expect("a student");
    old_student(&db, Uuid::now_v7(), "CD-2002", None)
        .await
        .expect("still the old rule");

    // Resolved: one of each pair was a typo.
    db.execute_unprepared(
        "UPDATE students SET document_number = 'AB-1002' WHERE document_number = 'AB-1001'",
    )
    .await
    .expect("resolve");
    db.execute_unprepared("DELETE FROM students WHERE document_number = 'CD-2002'")
        .await
        .expect("resolve");
    migrations::apply::<migrations::student::Migrator>(&db, migrations::STUDENT_LOCK_ID)
        .await
        .expect("the upgrade, once the rows allow it");
    assert_eq!(
        applied_migrations(&db).await,
        migrations::student::Migrator::migrations().len()
    );
    old_student(&db, Uuid::now_v7(), "EF-3003", None)
        .await
        .expect("a student");
    assert!(
        old_student(&db, Uuid::now_v7(), "ef-3003", None)
            .await
            .is_err(),
        "unique ignoring case"
    );
    db.close().await.ok();
}
