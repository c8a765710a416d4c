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
    a_users_upgrade_the_rows_refuse_changes_nothing_until_they_are_resolved,
    the_migrate_command_applies_each_schema_alone,
    users_from_before_source_versions_reflect_their_students_first_version,
);

/// The Student DB's migrations up to (and including) the fifth, the schema before
/// `error_code` and student versions existed.
const BEFORE: u32 = 5;

/// The test's Student DB with its first `applied` migrations applied: the schema of an
/// earlier version. In one transaction, as the services apply migrations (on SQLite the
/// schema changes must not be spread over the pool's connections).
async fn student_db_at(dbs: &TestDatabases, applied: u32) -> DatabaseConnection {
    db_at::<migrations::student::Migrator>(&dbs.student_url, applied).await
}

/// The database at `url` with the first `applied` migrations of `M`.
async fn db_at<M: MigratorTrait>(url: &str, applied: u32) -> DatabaseConnection {
    let db = platform::db::connect(url).await.expect("connect");
    let txn = db.begin().await.expect("begin");
    M::up(&txn, Some(applied)).await.expect("the older schema");
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

async fn applied_migrations<M: MigratorTrait>(db: &DatabaseConnection) -> usize {
    M::get_applied_migrations(db)
        .await
        .expect("read the applied migrations")
        .len()
}

/// Starts `binary` (a service) on `database_url` and waits for it to stop instead of
/// serving, as it must when its migrations fail; returns what it logged.
fn a_start_that_stops(dbs: &TestDatabases, binary: &str, database_url: &str) -> String {
    let log = dbs.dir.path().join(format!("{binary}.log"));
    let mut service = devstack::Process::spawn_isolated(
        &binaries().join(binary),
        &["--listen", "127.0.0.1:0", "--database-url", database_url].map(str::to_owned),
        &[],
        &log,
    )
    .unwrap_or_else(|err| panic!("start {binary}: {err:#}"));
    let status = service
        .wait_timeout(Duration::from_secs(60))
        .expect("wait")
        .unwrap_or_else(|| panic!("{binary} stops instead of serving"));
    assert!(!status.success(), "{status}");
    std::fs::read_to_string(&log).expect("its log")
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
    let logged = a_start_that_stops(&dbs, "student-svc", &dbs.student_url);
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
        applied_migrations::<migrations::student::Migrator>(&db).await,
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
        applied_migrations::<migrations::student::Migrator>(&db).await,
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

/// The Users DB's migrations before the one that makes document numbers of enabled users
/// unique ignoring case.
const USERS_BEFORE_CASE_INSENSITIVE: u32 = 2;

/// Writes an `enabled` user with `document_number`, as the Users DB's first schema allows.
async fn old_user(
    db: &impl ConnectionTrait,
    document_number: &str,
    enabled: bool,
) -> Result<(), sea_orm::DbErr> {
    let insert = Query::insert()
        .into_table(Alias::new("users"))
        .columns(
            [
                "id",
                "email",
                "first_name",
                "last_name",
                "document_number",
                "student_id",
                "enabled",
                "created_at",
            ]
            .map(Alias::new),
        )
        .values_panic([
            Uuid::now_v7().into(),
            "ana@example.edu".into(),
            "Ana".into(),
            "Pérez".into(),
            document_number.into(),
            Uuid::now_v7().into(),
            enabled.into(),
            platform::db::now().into(),
        ])
        .to_owned();
    db.execute(&insert).await.map(|_| ())
}

/// Users written before users had a `source_version` (the fourth Users migration) were
/// each created from its student's first version: they reflect version 1, as the Student
/// side's upgrade records it synced, not 0 (which `relay audit` would report as a Users DB
/// gone back, and `relay resend` would send changes again for).
async fn users_from_before_source_versions_reflect_their_students_first_version(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let db = db_at::<migrations::users::Migrator>(&dbs.users_url, 3).await;
    old_user(&db, "DOC-1", true).await.expect("an old user");
    migrations::apply::<migrations::users::Migrator>(&db, migrations::USERS_LOCK_ID)
        .await
        .expect("upgraded");
    let users = users_svc::entity::users::Entity::find()
        .all(&db)
        .await
        .expect("users");
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].source_version, 1);
}

/// The same as [`an_upgrade_the_rows_refuse_changes_nothing_until_they_are_resolved`] for
/// the Users DB, whose rule holds among *enabled* users: two enabled users whose numbers
/// differ only in case stop users-svc and change nothing; disabling one resolves it.
async fn a_users_upgrade_the_rows_refuse_changes_nothing_until_they_are_resolved(backend: Backend) {
    type Users = migrations::users::Migrator;
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let db = db_at::<Users>(&dbs.users_url, USERS_BEFORE_CASE_INSENSITIVE).await;
    old_user(&db, "ab-1001", true).await.expect("a user");
    old_user(&db, "AB-1001", true)
        .await
        .expect("allowed by the old schema");

    let logged = a_start_that_stops(&dbs, "users-svc", &dbs.users_url);
    assert!(
        logged.contains("users_enabled_document_number_key"),
        "{logged}"
    );
    let refused = migrations::apply::<Users>(&db, migrations::USERS_LOCK_ID)
        .await
        .expect_err("two enabled numbers that differ only in case");
    assert!(
        refused
            .to_string()
            .contains("users_enabled_document_number_key"),
        "{refused}"
    );
    assert_eq!(
        applied_migrations::<Users>(&db).await,
        USERS_BEFORE_CASE_INSENSITIVE as usize
    );
    old_user(&db, "CD-2002", true).await.expect("a user");
    old_user(&db, "cd-2002", true)
        .await
        .expect("still the old rule");

    // Resolved: one user of each pair disabled (a disabled user keeps its number).
    db.execute_unprepared(
        "UPDATE users SET enabled = FALSE WHERE document_number IN ('AB-1001', 'cd-2002')",
    )
    .await
    .expect("resolve");
    migrations::apply::<Users>(&db, migrations::USERS_LOCK_ID)
        .await
        .expect("the upgrade, once the rows allow it");
    assert_eq!(
        applied_migrations::<Users>(&db).await,
        Users::migrations().len()
    );
    old_user(&db, "EF-3003", true).await.expect("a user");
    assert!(
        old_user(&db, "ef-3003", true).await.is_err(),
        "unique ignoring case among enabled users"
    );
    old_user(&db, "ef-3003", false)
        .await
        .expect("a disabled user may share it");
    db.close().await.ok();
}

/// README: `migrate student|users` (`up` by default) applies a schema without starting a
/// service, and `status` lists every migration as applied; a service's one-shot command
/// then finds the schema current.
async fn the_migrate_command_applies_each_schema_alone(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let run = |args: &[&str]| {
        let output = std::process::Command::new(binaries().join("migrate"))
            .env_clear()
            .args(args)
            .output()
            .expect("run migrate");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "migrate {args:?}: {stderr}");
        stderr
    };
    let schemas = [
        (
            "student",
            &dbs.student_url,
            migrations::student::Migrator::migrations().len(),
        ),
        (
            "users",
            &dbs.users_url,
            migrations::users::Migrator::migrations().len(),
        ),
    ];
    for (schema, url, migrations) in schemas {
        run(&[schema, "--database-url", url]);
        let status = run(&[schema, "--database-url", url, "status"]);
        let listed = |state: &str| {
            status
                .lines()
                .filter(|line| line.contains("Migration '") && line.ends_with(state))
                .count()
        };
        assert_eq!(
            (listed("Applied"), listed("Pending")),
            (migrations, 0),
            "{status}"
        );
    }
    let relay_status = std::process::Command::new(binaries().join("relay"))
        .env_clear()
        .args(["--database-url", &dbs.student_url, "status"])
        .output()
        .expect("run relay status");
    assert_eq!(relay_status.status.code(), Some(0), "{relay_status:?}");
    let inbox = std::process::Command::new(binaries().join("users-svc"))
        .env_clear()
        .args([
            "--database-url",
            &dbs.users_url,
            "--inbox-retention",
            "30d",
            "inbox",
            "purge",
        ])
        .output()
        .expect("run users-svc inbox purge");
    assert_eq!(inbox.status.code(), Some(0), "{inbox:?}");
}
