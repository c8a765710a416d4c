//! A student's life after creation: UpdateStudent and DeactivateStudent commit the new
//! version with one outbox row each, and the relay delivers a student's rows in version
//! order, each only once the one before it is done.

use proto::student::v1::{
    CreateStudentRequest, DeactivateStudentRequest, GetStudentRequest, ListStudentsRequest,
    Student, UpdateStudentRequest, UserLinkStatus,
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, sea_query::Expr};
use student_store::{
    effect::{DISABLE_USER, Effect, UPDATE_USER, UpdateUserPayload},
    entity::outbox::{self, FailureKind, OutboxStatus},
    outbox::Claim,
};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;
use users_svc::entity::users;
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{Backend, TestApp, invariants::students_and_outbox_rows, spawn_app, student_request},
};

on_both_backends!(
    an_update_commits_the_new_version_with_one_update_user_row,
    a_change_that_changes_nothing_writes_nothing,
    a_keyed_change_that_changes_nothing_keeps_its_key,
    racing_copies_of_one_keyed_change_all_get_its_answer,
    changes_recorded_together_refuse_the_one_whose_student_lost_its_link,
    a_stale_expected_version_is_aborted_and_writes_nothing,
    an_expected_version_ahead_of_the_student_is_aborted_too,
    concurrent_changes_of_one_student_are_each_applied_in_turn,
    client_keys_answer_retries_and_refuse_other_requests,
    a_retry_of_an_update_accepted_before_the_names_rule_gets_its_student,
    an_inactive_student_accepts_no_update,
    a_students_rows_are_delivered_one_at_a_time_in_version_order,
    a_failed_update_holds_back_that_students_later_rows_only,
    invalid_change_fields_are_named_and_nothing_is_stored,
);

async fn create(app: &TestApp, n: usize) -> Student {
    app.student
        .clone()
        .create_student(student_request(n))
        .await
        .expect("created")
        .into_inner()
}

fn update(student: &Student, first_name: &str) -> UpdateStudentRequest {
    UpdateStudentRequest {
        id: student.id.clone(),
        first_name: first_name.to_owned(),
        last_name: student.last_name.clone(),
        email: student.email.clone(),
        idempotency_key: None,
        expected_version: 0,
    }
}

fn deactivate(student: &Student) -> DeactivateStudentRequest {
    DeactivateStudentRequest {
        id: student.id.clone(),
        idempotency_key: None,
    }
}

async fn get(app: &TestApp, id: &str) -> Student {
    app.student
        .clone()
        .get_student(GetStudentRequest { id: id.to_owned() })
        .await
        .expect("found")
        .into_inner()
}

async fn rows_of(app: &TestApp, id: &str) -> Vec<outbox::Model> {
    outbox::Entity::find()
        .filter(outbox::Column::AggregateId.eq(Uuid::parse_str(id).expect("uuid")))
        .order_by_asc(outbox::Column::AggregateVersion)
        .all(&app.student_db)
        .await
        .expect("outbox")
}

fn reason(status: &Status) -> (Code, String) {
    let reason = status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default();
    (status.code(), reason)
}

/// Runs relay batches until one finds nothing to claim; returns how many batches claimed.
async fn drain(app: &TestApp) -> usize {
    let relay = app.relay();
    let mut batches = 0;
    while relay.deliver_batch().await.expect("batch").claimed > 0 {
        batches += 1;
        assert!(batches < 20, "the outbox never drained");
    }
    batches
}

async fn an_update_commits_the_new_version_with_one_update_user_row(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    assert_eq!(
        (student.version, student.synced_version, student.active),
        (1, 0, true)
    );
    let updated = app
        .student
        .clone()
        .update_student(UpdateStudentRequest {
            email: "ana.gomez@example.edu".into(),
            ..update(&student, "Anita")
        })
        .await
        .expect("updated")
        .into_inner();
    assert_eq!(
        (
            updated.version,
            updated.first_name.as_str(),
            updated.email.as_str(),
            updated.document_number.as_str()
        ),
        (
            2,
            "Anita",
            "ana.gomez@example.edu",
            student.document_number.as_str()
        )
    );
    let rows = rows_of(&app, &student.id).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (
            rows[1].effect_type.as_str(),
            rows[1].aggregate_version,
            rows[1].status
        ),
        (UPDATE_USER, 2, OutboxStatus::Pending)
    );
    assert_eq!(
        Effect::decode(&rows[1].effect_type, &rows[1].payload),
        Ok(Effect::UpdateUser(UpdateUserPayload {
            version: UpdateUserPayload::VERSION,
            student_id: Uuid::parse_str(&student.id).expect("uuid"),
            first_name: "Anita".into(),
            last_name: student.last_name.clone(),
            email: "ana.gomez@example.edu".into(),
            source_version: 2,
        }))
    );
    assert_ne!(
        rows[1].idempotency_key, rows[0].idempotency_key,
        "its own key"
    );

    // The create-user row first, then the update: two batches.
    assert_eq!(drain(&app).await, 2);
    let synced = get(&app, &student.id).await;
    assert_eq!((synced.version, synced.synced_version), (2, 2));
    let user = users::Entity::find()
        .one(&app.users_db)
        .await
        .expect("users")
        .expect("the user");
    assert_eq!(
        (
            user.first_name.as_str(),
            user.email.as_str(),
            user.source_version,
            user.id.to_string()
        ),
        ("Anita", "ana.gomez@example.edu", 2, synced.user_id)
    );
}

async fn a_change_that_changes_nothing_writes_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let same = app
        .student
        .clone()
        .update_student(update(&student, &student.first_name))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(same.version, 1, "no version spent");
    // Each field alone is a change: a new e-mail, then a new last name.
    let new_email = UpdateStudentRequest {
        email: "ana.new@example.edu".into(),
        ..update(&student, &student.first_name)
    };
    let new_last_name = UpdateStudentRequest {
        last_name: "Gómez".into(),
        ..new_email.clone()
    };
    for (version, request) in [(2, new_email), (3, new_last_name)] {
        let changed = app
            .student
            .clone()
            .update_student(request)
            .await
            .expect("updated")
            .into_inner();
        assert_eq!(changed.version, version);
    }
    for _ in 0..2 {
        let inactive = app
            .student
            .clone()
            .deactivate_student(deactivate(&student))
            .await
            .expect("deactivated")
            .into_inner();
        assert_eq!((inactive.version, inactive.active), (4, false));
    }
    let rows = rows_of(&app, &student.id).await;
    let effects: Vec<&str> = rows.iter().map(|row| row.effect_type.as_str()).collect();
    assert_eq!(
        effects,
        ["create-user", "update-user", "update-user", DISABLE_USER],
        "deactivating twice is one change"
    );
    let sent = |row: &outbox::Model| {
        let field = |name: &str| row.payload[name].as_str().unwrap_or_default().to_owned();
        (field("email"), field("last_name"))
    };
    assert_eq!(
        (sent(&rows[1]), sent(&rows[2])),
        (
            ("ana.new@example.edu".to_owned(), student.last_name.clone()),
            ("ana.new@example.edu".to_owned(), "Gómez".to_owned())
        )
    );
}

/// README ("Same operation, or two operations…"): a keyed UpdateStudent or
/// DeactivateStudent that changes nothing spends no version and writes no effect, but keeps
/// its key as any change does. Its retries, racing or later, are answered as retries: after
/// another client's rename, the student as it is now, the rename kept (judged afresh, the
/// retry would put the old names back). The key sent with another request, or by the other
/// change RPC, is refused as reused. (Not by CreateStudent, which finds keys through its
/// own insert's unique index and does not read this one: README says so.)
async fn a_keyed_change_that_changes_nothing_keeps_its_key(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let mut client = app.student.clone();
    let same = UpdateStudentRequest {
        idempotency_key: Some("same-names".into()),
        ..update(&student, &student.first_name)
    };
    let racing = futures::future::join_all((0..8).map(|_| {
        let (mut client, same) = (client.clone(), same.clone());
        async move { client.update_student(same).await }
    }))
    .await;
    for answer in racing {
        let answer = answer.expect("answered").into_inner();
        assert_eq!(answer.version, 1, "no version spent");
    }
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 1));

    client
        .update_student(update(&student, "Renamed"))
        .await
        .expect("renamed by another client");
    let again = client
        .update_student(same.clone())
        .await
        .expect("a retry")
        .into_inner();
    assert_eq!((again.first_name.as_str(), again.version), ("Renamed", 2));
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 2));

    let reused = [
        client
            .update_student(UpdateStudentRequest {
                first_name: "Other".into(),
                ..same.clone()
            })
            .await
            .expect_err("another request"),
        client
            .deactivate_student(DeactivateStudentRequest {
                idempotency_key: same.idempotency_key.clone(),
                ..deactivate(&student)
            })
            .await
            .expect_err("another RPC"),
    ];
    for status in reused {
        assert_eq!(
            reason(&status),
            (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
        );
    }
    let now = get(&app, &student.id).await;
    assert_eq!(
        (now.first_name.as_str(), now.version, now.active),
        ("Renamed", 2, true)
    );
    // CreateStudent finds keys through its own insert's unique index, which holds no kept
    // key: it creates its student. Then the key has two records, and the first call's
    // retry is still recognised by its own.
    client
        .create_student(CreateStudentRequest {
            idempotency_key: same.idempotency_key.clone(),
            ..student_request(2)
        })
        .await
        .expect("created: not refused");
    let still = client
        .update_student(same.clone())
        .await
        .expect("still a retry")
        .into_inner();
    assert_eq!((still.first_name.as_str(), still.version), ("Renamed", 2));
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (2, 3));

    // Deactivating an inactive student changes nothing either, and keeps its key too.
    client
        .deactivate_student(deactivate(&student))
        .await
        .expect("deactivated");
    let off_again = DeactivateStudentRequest {
        idempotency_key: Some("off-again".into()),
        ..deactivate(&student)
    };
    let off = client
        .deactivate_student(off_again.clone())
        .await
        .expect("answered")
        .into_inner();
    assert_eq!((off.version, off.active), (3, false));
    let status = client
        .update_student(UpdateStudentRequest {
            idempotency_key: off_again.idempotency_key.clone(),
            ..update(&student, "Renamed")
        })
        .await
        .expect_err("another RPC");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (2, 4));
}

/// README ("Errors a program can read"): copies of one keyed change sent at once (a client
/// retrying a call that timed out while the first is still running) all get that change's
/// answer. Each copy finds no record of its key before it waits for the student's lock; the
/// first commits, and the others, finding the student moved past their `expected_version`
/// (or already inactive), are answered from the key, not refused `VERSION_MISMATCH`.
async fn racing_copies_of_one_keyed_change_all_get_its_answer(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let rename = UpdateStudentRequest {
        idempotency_key: Some("rename-race".into()),
        expected_version: 1,
        ..update(&student, "Renamed")
    };
    let renames = futures::future::join_all((0..8).map(|_| {
        let (mut client, rename) = (app.student.clone(), rename.clone());
        async move { client.update_student(rename).await }
    }))
    .await;
    for answer in renames {
        let answer = answer.expect("each copy answered").into_inner();
        assert_eq!((answer.first_name.as_str(), answer.version), ("Renamed", 2));
    }
    let off = DeactivateStudentRequest {
        idempotency_key: Some("off-race".into()),
        ..deactivate(&student)
    };
    let deactivations = futures::future::join_all((0..8).map(|_| {
        let (mut client, off) = (app.student.clone(), off.clone());
        async move { client.deactivate_student(off).await }
    }))
    .await;
    for answer in deactivations {
        let answer = answer.expect("each copy answered").into_inner();
        assert_eq!((answer.version, answer.active), (3, false));
    }
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 3));
}

async fn a_stale_expected_version_is_aborted_and_writes_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let mut client = app.student.clone();
    client
        .update_student(UpdateStudentRequest {
            expected_version: 1,
            ..update(&student, "Second")
        })
        .await
        .expect("at version 1");
    let status = client
        .update_student(UpdateStudentRequest {
            expected_version: 1,
            ..update(&student, "Third")
        })
        .await
        .expect_err("the student is at version 2 now");
    assert_eq!(reason(&status), (Code::Aborted, "VERSION_MISMATCH".into()));
    assert_eq!(
        status.message(),
        "the student is at version 2, not the expected 1"
    );
    let now = get(&app, &student.id).await;
    assert_eq!((now.version, now.first_name.as_str()), (2, "Second"));
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 2));
}

/// `expected_version` must be the student's version, not merely no older: one ahead of it
/// (a client that guessed) is refused the same way and writes nothing.
async fn an_expected_version_ahead_of_the_student_is_aborted_too(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let status = app
        .student
        .clone()
        .update_student(UpdateStudentRequest {
            expected_version: 2,
            ..update(&student, "Second")
        })
        .await
        .expect_err("the student is at version 1");
    assert_eq!(reason(&status), (Code::Aborted, "VERSION_MISMATCH".into()));
    assert_eq!(
        status.message(),
        "the student is at version 1, not the expected 2"
    );
    let now = get(&app, &student.id).await;
    assert_eq!((now.version, &now.first_name), (1, &student.first_name));
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 1));
}

/// Changes of one student racing each other are applied one after the other (the change
/// reads the student under a lock), none refused: twenty renames at once end at version
/// 21 with one update-user row for each version from 2 to 21.
async fn concurrent_changes_of_one_student_are_each_applied_in_turn(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let renames = (0..20).map(|n| {
        let (mut client, request) = (app.student.clone(), update(&student, &format!("Name{n}")));
        async move { client.update_student(request).await }
    });
    for answer in futures::future::join_all(renames).await {
        answer.expect("every rename applied");
    }
    assert_eq!(get(&app, &student.id).await.version, 21);
    let versions: Vec<i64> = rows_of(&app, &student.id)
        .await
        .into_iter()
        .map(|row| row.aggregate_version)
        .collect();
    assert_eq!(versions, (1..=21).collect::<Vec<i64>>());
}

async fn client_keys_answer_retries_and_refuse_other_requests(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let mut client = app.student.clone();
    let keyed = UpdateStudentRequest {
        idempotency_key: Some("rename-1".into()),
        expected_version: 1,
        ..update(&student, "Renamed")
    };
    let first = client
        .update_student(keyed.clone())
        .await
        .expect("updated")
        .into_inner();
    // The same request again: the same student, nothing written, even though its expected
    // version is no longer current (the key is checked before any rule).
    let again = client
        .update_student(keyed.clone())
        .await
        .expect("a retry")
        .into_inner();
    assert_eq!(again, first);
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 2));

    let other = UpdateStudentRequest {
        first_name: "Other".into(),
        ..keyed.clone()
    };
    let status = client.update_student(other).await.expect_err("key reused");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    let status = client
        .deactivate_student(DeactivateStudentRequest {
            idempotency_key: Some("rename-1".into()),
            ..deactivate(&student)
        })
        .await
        .expect_err("key reused by another RPC");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    let status = client
        .create_student(CreateStudentRequest {
            idempotency_key: Some("rename-1".into()),
            ..student_request(2)
        })
        .await
        .expect_err("key reused by CreateStudent");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    // The new student's row was fine; its outbox row broke the key's unique index. Both
    // are one statement on PostgreSQL (one transaction on SQLite), so neither stays. (With
    // the two sent apart, student first, the student stayed and this call "succeeded".
    // The other order is caught by `a_second_student_with_the_same_document_number_is_rejected`.)
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 2));
    let now = get(&app, &student.id).await;
    assert_eq!((now.version, now.active), (2, true));
}

/// README ("Validation"): an UpdateStudent accepted before Student refused invisible
/// formatting in names (saved here as the older student-svc saved it: the student's name
/// and the change's fingerprint under its key) is answered from its key when retried, the
/// student as it is now, not refused by the rule; a new UpdateStudent carrying the same
/// name is refused, naming the field, and writes nothing.
async fn a_retry_of_an_update_accepted_before_the_names_rule_gets_its_student(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let keyed = |first_name: &str, key: &str| UpdateStudentRequest {
        idempotency_key: Some(key.to_owned()),
        ..update(&student, first_name)
    };
    app.student
        .clone()
        .update_student(keyed("Renamed", "rename-1"))
        .await
        .expect("renamed");
    let older = keyed("Ana\u{200B}Luz", "rename-1");
    let fingerprint = student_svc::StudentChange::try_from(older.clone())
        .expect("valid but for Student's names rule")
        .request_hash();
    let id = Uuid::parse_str(&student.id).expect("uuid");
    student_store::entity::students::Entity::update_many()
        .col_expr(
            student_store::entity::students::Column::FirstName,
            Expr::value(older.first_name.clone()),
        )
        .filter(student_store::entity::students::Column::Id.eq(id))
        .exec(&app.student_db)
        .await
        .expect("the student as the older service saved it");
    outbox::Entity::update_many()
        .col_expr(outbox::Column::RequestHash, Expr::value(fingerprint))
        .filter(outbox::Column::ClientKey.eq("rename-1"))
        .exec(&app.student_db)
        .await
        .expect("the change's fingerprint as the older service saved it");

    let again = app
        .student
        .clone()
        .update_student(older)
        .await
        .expect("the retry gets its student")
        .into_inner();
    assert_eq!(
        (again.version, again.first_name.as_str()),
        (2, "Ana\u{200B}Luz")
    );
    let status = app
        .student
        .clone()
        .update_student(keyed("Ana\u{200B}Luz", "rename-2"))
        .await
        .expect_err("a new request");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "invalid first_name: must not contain invisible formatting characters \
             (bidirectional overrides, zero-width spaces, tags)"
        )
    );
    assert_eq!(get(&app, &student.id).await.version, 2);
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 2));
}

async fn an_inactive_student_accepts_no_update(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    app.student
        .clone()
        .deactivate_student(deactivate(&student))
        .await
        .expect("deactivated");
    let status = app
        .student
        .clone()
        .update_student(update(&student, "Late"))
        .await
        .expect_err("inactive");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "STUDENT_INACTIVE".into())
    );
    let now = get(&app, &student.id).await;
    assert_eq!(
        (now.version, now.active, now.first_name),
        (2, false, student.first_name)
    );
}

async fn a_students_rows_are_delivered_one_at_a_time_in_version_order(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let (a, b) = (create(&app, 1).await, create(&app, 2).await);
    let mut client = app.student.clone();
    for name in ["A2", "A3"] {
        client
            .update_student(update(&a, name))
            .await
            .expect("updated");
    }
    client
        .deactivate_student(deactivate(&a))
        .await
        .expect("deactivated");
    client
        .update_student(update(&b, "B2"))
        .await
        .expect("updated");

    // Each batch may take one row per student: the oldest one not yet done.
    let relay = app.relay();
    let mut delivered = Vec::new();
    loop {
        let claimed = student_store::outbox::claim_batch(
            &app.student_db,
            &relay.id,
            100,
            std::time::Duration::from_secs(60),
        )
        .await
        .expect("claim");
        if claimed.is_empty() {
            break;
        }
        let mut per_student: Vec<Uuid> = claimed.iter().map(|row| row.aggregate_id).collect();
        per_student.dedup();
        assert_eq!(
            per_student.len(),
            claimed.len(),
            "one row per student at a time"
        );
        // Give them back, then let the relay deliver exactly these.
        student_store::outbox::release(
            &app.student_db,
            &claimed.iter().map(Claim::from).collect::<Vec<_>>(),
            &relay.id,
        )
        .await
        .expect("release");
        relay.deliver_batch().await.expect("batch");
        delivered.push(
            claimed
                .iter()
                .map(|row| (row.aggregate_id.to_string(), row.aggregate_version))
                .collect::<Vec<_>>(),
        );
    }
    let a_order: Vec<i64> = delivered
        .iter()
        .flatten()
        .filter(|(id, _)| *id == a.id)
        .map(|(_, version)| *version)
        .collect();
    assert_eq!(a_order, [1, 2, 3, 4], "in version order, one per batch");
    assert_eq!(
        delivered.len(),
        4,
        "B's two rows rode along with A's first two"
    );

    let (a, b) = (get(&app, &a.id).await, get(&app, &b.id).await);
    assert_eq!((a.version, a.synced_version, a.active), (4, 4, false));
    assert_eq!((b.version, b.synced_version), (2, 2));
    let user_a = users::Entity::find()
        .filter(users::Column::Id.eq(Uuid::parse_str(&a.user_id).expect("uuid")))
        .one(&app.users_db)
        .await
        .expect("users")
        .expect("user of A");
    assert_eq!(
        (
            user_a.first_name.as_str(),
            user_a.enabled,
            user_a.source_version
        ),
        ("A3", false, 4)
    );
}

async fn a_failed_update_holds_back_that_students_later_rows_only(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let (a, b) = (create(&app, 1).await, create(&app, 2).await);
    let mut client = app.student.clone();
    // Two changes wait behind A's update: every one of them counts as blocked.
    for name in ["A2", "A3"] {
        client
            .update_student(update(&a, name))
            .await
            .expect("updated");
    }
    client
        .deactivate_student(deactivate(&a))
        .await
        .expect("deactivated");
    client
        .update_student(update(&b, "B2"))
        .await
        .expect("updated");
    // A's update can never be delivered: its stored payload is broken.
    let broken = rows_of(&app, &a.id).await.remove(1);
    outbox::Entity::update_many()
        .col_expr(
            outbox::Column::Payload,
            Expr::value(serde_json::json!({ "version": 1 })),
        )
        .filter(outbox::Column::Id.eq(broken.id))
        .exec(&app.student_db)
        .await
        .expect("break the payload");

    drain(&app).await;
    let statuses = |rows: Vec<outbox::Model>| {
        rows.into_iter()
            .map(|row| (row.aggregate_version, row.status))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        statuses(rows_of(&app, &a.id).await),
        [
            (1, OutboxStatus::Done),
            (2, OutboxStatus::Failed),
            (3, OutboxStatus::Pending),
            (4, OutboxStatus::Pending)
        ],
        "A's later update and deactivation wait behind its failed update"
    );
    assert_eq!(
        statuses(rows_of(&app, &b.id).await),
        [(1, OutboxStatus::Done), (2, OutboxStatus::Done)],
        "B is not held back"
    );
    let failed = rows_of(&app, &a.id).await.remove(1);
    assert_eq!(
        (failed.failure_kind, failed.error_code.as_deref()),
        (Some(FailureKind::Rejected), Some("UNREADABLE_PAYLOAD"))
    );
    let a = get(&app, &a.id).await;
    assert_eq!((a.version, a.synced_version), (4, 1));
    // The link is the create-user row's, done: a failed or waiting change of the student
    // does not make it look unlinked, in GetStudent or in ListStudents.
    let link = |student: &Student| {
        (
            student.user_link_status(),
            student.user_id.clone(),
            student.link_error.clone(),
        )
    };
    assert_eq!(link(&a).0, UserLinkStatus::Linked);
    assert!(!a.user_id.is_empty() && a.link_error.is_empty(), "{a:?}");
    let listed = app
        .student
        .clone()
        .list_students(ListStudentsRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .students;
    let listed_a = listed
        .iter()
        .find(|student| student.id == a.id)
        .expect("A listed");
    assert_eq!(link(listed_a), link(&a));
    let report = relay::status::read(&app.student_db).await.expect("status");
    assert_eq!(
        (report.pending, report.failed, report.blocked, report.done),
        (0, 1, 2, 3)
    );
}

async fn invalid_change_fields_are_named_and_nothing_is_stored(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let student = create(&app, 1).await;
    let mut client = app.student.clone();
    type Spoil = fn(&mut UpdateStudentRequest);
    let cases: [(Spoil, &str); 7] = [
        (|r| r.id = "nope".into(), "id"),
        (|r| r.first_name = String::new(), "first_name"),
        (|r| r.first_name = "Ana\u{2067}".into(), "first_name"),
        (|r| r.last_name = " Pérez".into(), "last_name"),
        // Student's rule for names, not only Users' looser one, on the last name too.
        (|r| r.last_name = "Pérez\u{202E}".into(), "last_name"),
        (|r| r.email = "no-at-sign".into(), "email"),
        (
            |r| r.idempotency_key = Some("bad key".into()),
            "idempotency_key",
        ),
    ];
    for (spoil, field) in cases {
        let mut request = update(&student, "Valid");
        spoil(&mut request);
        let status = client.update_student(request).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let violations = status.get_details_bad_request().expect("BadRequest");
        assert_eq!(violations.field_violations[0].field, field);
    }
    let status = client
        .deactivate_student(DeactivateStudentRequest {
            id: String::new(),
            idempotency_key: None,
        })
        .await
        .expect_err("no id");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = client
        .update_student(UpdateStudentRequest {
            id: Uuid::now_v7().to_string(),
            ..update(&student, "Valid")
        })
        .await
        .expect_err("unknown");
    assert_eq!(
        reason(&status),
        (Code::NotFound, "STUDENT_NOT_FOUND".into())
    );
    assert_eq!(students_and_outbox_rows(&app.student_db).await, (1, 1));
    assert_eq!(get(&app, &student.id).await.version, 1);
}

/// The relay records answered rows many to a transaction: a change answered for a student
/// that lost its link meanwhile is refused there as alone (`NOT_LINKED`: a changed user is
/// taken only by the student linked to it), and only that row, its student untouched; the
/// change beside it is recorded.
async fn changes_recorded_together_refuse_the_one_whose_student_lost_its_link(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let students = [create(&app, 1).await, create(&app, 2).await];
    drain(&app).await;
    let mut users = Vec::new();
    for student in &students {
        let linked = get(&app, &student.id).await;
        users.push(Uuid::parse_str(&linked.user_id).expect("linked"));
        app.student
            .clone()
            .update_student(update(student, "Renamed"))
            .await
            .expect("updated");
    }
    let lost = crate::relay_delivery::unlink_by_hand(&app, &students[1].id).await;
    let claimed = student_store::outbox::claim_batch(
        &app.student_db,
        "relay-a",
        2,
        std::time::Duration::from_secs(60),
    )
    .await
    .expect("claim");
    assert_eq!(claimed.len(), 2);
    let deliveries: Vec<_> = claimed
        .iter()
        .zip(&users)
        .map(|(row, user)| {
            (
                row.clone(),
                student_store::outbox::Delivered::UserChanged(*user),
            )
        })
        .collect();
    let recorded =
        student_store::outbox::record_deliveries(&app.student_db, "relay-a", &deliveries)
            .await
            .expect("batch");
    assert!(
        matches!(
            recorded.results[..],
            [Ok(()), Err(student_store::outbox::RecordError::NotLinked { student_id, .. })]
                if student_id == lost
        ),
        "{:?}",
        recorded.results
    );
    let refused = rows_of(&app, &students[1].id).await.remove(1);
    assert_eq!(refused, claimed[1], "the refused row is left as it was");
    let now = get(&app, &students[1].id).await;
    assert_eq!(
        (now.user_id.as_str(), now.version, now.synced_version),
        ("", 2, 1)
    );
    assert_eq!(get(&app, &students[0].id).await.synced_version, 2);
}
