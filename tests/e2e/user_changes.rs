//! UpdateUser and DisableUser: the same inbox rules as CreateUser, and a version guard that
//! never lets an older change of a student overwrite a newer one.

use proto::users::v1::{
    CreateUserRequest, DisableUserRequest, GetUserRequest, UpdateUserRequest, User,
};
use sea_orm::{ActiveModelTrait, ActiveValue::Set};
use tonic::{Code, Request, Status, metadata::MetadataValue};
use tonic_types::StatusExt as _;
use users_svc::entity::users;
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{
        Backend, TestApp,
        invariants::{stored_user, users_and_inbox_rows},
        spawn_app,
    },
};

on_both_backends!(
    an_older_change_never_overwrites_a_newer_one,
    a_repeated_change_returns_the_saved_answer_and_changes_nothing,
    change_keys_follow_the_inbox_rules,
    disabling_frees_the_document_number,
    a_change_goes_to_the_students_first_user_should_there_be_two,
    a_change_naming_its_user_goes_to_that_one_if_it_is_the_students,
    racing_first_deliveries_of_one_change_key_apply_it_once,
    racing_changes_of_one_user_leave_it_at_the_newest_version,
);

const STUDENT: &str = "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a";

async fn create_user(app: &TestApp) -> String {
    app.users
        .clone()
        .create_user(CreateUserRequest {
            idempotency_key: "create".into(),
            email: "ana.perez@example.edu".into(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            document_number: "DOC-1001".into(),
            student_id: STUDENT.into(),
        })
        .await
        .expect("created")
        .into_inner()
        .user_id
}

fn update(key: &str, first_name: &str, version: u64) -> UpdateUserRequest {
    UpdateUserRequest {
        idempotency_key: key.into(),
        student_id: STUDENT.into(),
        first_name: first_name.into(),
        last_name: "Pérez".into(),
        email: "ana.perez@example.edu".into(),
        source_version: version,
        user_id: String::new(),
    }
}

fn disable(key: &str, version: u64) -> DisableUserRequest {
    DisableUserRequest {
        idempotency_key: key.into(),
        student_id: STUDENT.into(),
        source_version: version,
        user_id: String::new(),
    }
}

async fn user(app: &TestApp, id: &str) -> User {
    app.users
        .clone()
        .get_user(GetUserRequest { id: id.into() })
        .await
        .expect("found")
        .into_inner()
}

fn reason(status: &Status) -> (Code, String) {
    let reason = status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default();
    (status.code(), reason)
}

async fn an_older_change_never_overwrites_a_newer_one(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_user(&app).await;
    let mut users = app.users.clone();
    let newer = users
        .update_user(update("v3", "Third", 3))
        .await
        .expect("applied")
        .into_inner();
    assert_eq!((newer.user_id.as_str(), newer.applied), (id.as_str(), true));
    // Version 2 arrives late (delivered directly, out of order): not applied, saved.
    let older = users
        .update_user(update("v2", "Second", 2))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(
        (older.user_id.as_str(), older.applied),
        (id.as_str(), false)
    );
    let stale_disable = users
        .disable_user(disable("d3", 3))
        .await
        .expect("answered")
        .into_inner();
    assert!(!stale_disable.applied, "an equal version is not newer");
    let now = user(&app, &id).await;
    assert_eq!(
        (now.first_name.as_str(), now.enabled, now.source_version),
        ("Third", true, 3),
        "nothing older or equal changed it"
    );
    // The late answer is saved: its key gets the same answer, marked as a replay.
    let replayed = users
        .update_user(update("v2", "Second", 2))
        .await
        .expect("answered");
    assert_eq!(
        replayed
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert!(!replayed.into_inner().applied);
    let disabled = users
        .disable_user(disable("d4", 4))
        .await
        .expect("applied")
        .into_inner();
    assert!(disabled.applied);
    let now = user(&app, &id).await;
    assert_eq!((now.enabled, now.source_version), (false, 4));
    // One user; inbox: create, v3, v2, d3, d4.
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 5));
}

async fn a_repeated_change_returns_the_saved_answer_and_changes_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_user(&app).await;
    let mut users = app.users.clone();
    let first = users
        .update_user(update("u2", "Second", 2))
        .await
        .expect("applied");
    assert!(first.metadata().get("idempotent-replayed").is_none());
    let first = first.into_inner();
    // Someone changes the user further (version 3) before the repeat arrives.
    users
        .update_user(update("u3", "Third", 3))
        .await
        .expect("applied");
    let again = users
        .update_user(update("u2", "Second", 2))
        .await
        .expect("replayed");
    assert!(again.metadata().get("idempotent-replayed").is_some());
    assert_eq!(again.into_inner(), first, "the saved answer, applied=true");
    assert_eq!(
        user(&app, &id).await.first_name,
        "Third",
        "the repeat changed nothing"
    );
    // Replay-only: the saved answer, or NOT_FOUND for a key never executed.
    let mut replay_only = Request::new(update("u2", "Second", 2));
    replay_only.metadata_mut().insert(
        "idempotency-replay-only",
        MetadataValue::from_static("true"),
    );
    assert!(
        users
            .update_user(replay_only)
            .await
            .expect("saved")
            .into_inner()
            .applied
    );
    let mut never = Request::new(disable("never-sent", 9));
    never.metadata_mut().insert(
        "idempotency-replay-only",
        MetadataValue::from_static("true"),
    );
    let status = users.disable_user(never).await.expect_err("unknown key");
    assert_eq!(reason(&status), (Code::NotFound, "NOT_IN_INBOX".into()));
    assert!(
        user(&app, &id).await.enabled,
        "a replay-only request never executes"
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 3));
}

async fn change_keys_follow_the_inbox_rules(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    // No user for the student yet: NOT_FOUND, and nothing saved, so a later delivery of the
    // same key (once the user exists) still executes.
    let status = users
        .update_user(update("early", "Second", 2))
        .await
        .expect_err("no user");
    assert_eq!(reason(&status), (Code::NotFound, "USER_NOT_FOUND".into()));
    let status = users
        .disable_user(disable("early-disable", 3))
        .await
        .expect_err("no user");
    assert_eq!(reason(&status), (Code::NotFound, "USER_NOT_FOUND".into()));
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
    create_user(&app).await;
    assert!(
        users
            .update_user(update("early", "Second", 2))
            .await
            .expect("executes now")
            .into_inner()
            .applied
    );
    // The same key with another request, or with another RPC, is a different operation.
    let status = users
        .update_user(update("early", "Other", 2))
        .await
        .expect_err("key reused");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    let status = users
        .disable_user(disable("early", 2))
        .await
        .expect_err("key reused by another RPC");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    let status = users
        .update_user(update("create", "Second", 2))
        .await
        .expect_err("CreateUser's key");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED".into())
    );
    // A malformed request names its field and stores nothing.
    for (request, field) in [
        (update("", "Second", 2), "idempotency_key"),
        (update("k", "", 2), "first_name"),
        (
            UpdateUserRequest {
                last_name: "P\u{0}rez".into(),
                ..update("k", "Second", 2)
            },
            "last_name",
        ),
        (
            UpdateUserRequest {
                email: "ana@".into(),
                ..update("k", "Second", 2)
            },
            "email",
        ),
        (update("k", "Second", 1), "source_version"),
        (
            UpdateUserRequest {
                student_id: "nope".into(),
                ..update("k", "Second", 2)
            },
            "student_id",
        ),
        (
            UpdateUserRequest {
                user_id: "nope".into(),
                ..update("k", "Second", 2)
            },
            "user_id",
        ),
    ] {
        let status = users.update_user(request).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument);
        let violations = status.get_details_bad_request().expect("BadRequest");
        assert_eq!(violations.field_violations[0].field, field);
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 2));
}

async fn disabling_frees_the_document_number(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_user(&app).await;
    let mut users = app.users.clone();
    let another = CreateUserRequest {
        idempotency_key: "another".into(),
        email: "other@example.edu".into(),
        first_name: "Other".into(),
        last_name: "Person".into(),
        document_number: "doc-1001".into(),
        student_id: Uuid::now_v7().to_string(),
    };
    let status = users
        .create_user(another.clone())
        .await
        .expect_err("taken, ignoring case");
    assert_eq!(status.code(), Code::AlreadyExists);
    users
        .disable_user(disable("d2", 2))
        .await
        .expect("disabled");
    users
        .create_user(CreateUserRequest {
            idempotency_key: "another-after".into(),
            ..another
        })
        .await
        .expect("the number is free once its holder is disabled");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (2, 4));
}

/// Should Users hold two users for one student (a row given a new key after its first key
/// had run and been purged, which `relay retry-failed` warns against), every change goes
/// to the same one, the first created, and the other is left alone. The first created is
/// written here second, with a greater id, so neither the order rows were written in nor
/// the ids can stand in for the creation time.
async fn a_change_goes_to_the_students_first_user_should_there_be_two(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let later = create_user(&app).await;
    let later_created_at = stored_user(&app.users_db, Uuid::parse_str(&later).expect("uuid"))
        .await
        .created_at;
    let first = Uuid::now_v7();
    users::ActiveModel {
        id: Set(first),
        email: Set("ana.again@example.edu".into()),
        first_name: Set("Ana".into()),
        last_name: Set("Pérez".into()),
        document_number: Set("DOC-2002".into()),
        student_id: Set(Uuid::parse_str(STUDENT).expect("uuid")),
        enabled: Set(true),
        created_at: Set(later_created_at - chrono::TimeDelta::hours(1)),
        source_version: Set(1),
    }
    .insert(&app.users_db)
    .await
    .expect("a user created before, for the same student");
    let first = first.to_string();

    let mut users = app.users.clone();
    let updated = users
        .update_user(update("u2", "Renamed", 2))
        .await
        .expect("applied")
        .into_inner();
    assert_eq!(
        (updated.user_id.as_str(), updated.applied),
        (first.as_str(), true)
    );
    let disabled = users
        .disable_user(disable("d3", 3))
        .await
        .expect("applied")
        .into_inner();
    assert_eq!(
        (disabled.user_id.as_str(), disabled.applied),
        (first.as_str(), true)
    );
    let changed = user(&app, &first).await;
    assert_eq!(
        (
            changed.first_name.as_str(),
            changed.enabled,
            changed.source_version
        ),
        ("Renamed", false, 3)
    );
    let untouched = user(&app, &later).await;
    assert_eq!(
        (
            untouched.first_name.as_str(),
            untouched.enabled,
            untouched.source_version
        ),
        ("Ana", true, 1)
    );
}

/// A change that names its user (as the relay does: the user the student is linked to)
/// goes to that one even when it is not the student's first; the same key naming another
/// user is still the same request (its saved answer, not IDEMPOTENCY_KEY_REUSED: the
/// fingerprint leaves the user out, so keys saved before callers named one stay valid). A
/// user Users does not have, or another student's, is refused, and nothing is saved.
async fn a_change_naming_its_user_goes_to_that_one_if_it_is_the_students(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let first = create_user(&app).await;
    let mut users = app.users.clone();
    let another_user = |key: &str, document_number: &str, student_id: String| {
        let mut users = app.users.clone();
        let request = CreateUserRequest {
            idempotency_key: key.into(),
            email: "ana.again@example.edu".into(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            document_number: document_number.into(),
            student_id,
        };
        async move {
            users
                .create_user(request)
                .await
                .expect("created")
                .into_inner()
                .user_id
        }
    };
    let second = another_user("create-2", "DOC-2002", STUDENT.into()).await;
    let someone_else = another_user("create-3", "DOC-3003", Uuid::now_v7().to_string()).await;
    let to = |user_id: &str, request: UpdateUserRequest| UpdateUserRequest {
        user_id: user_id.into(),
        ..request
    };

    let updated = users
        .update_user(to(&second, update("u2", "Renamed", 2)))
        .await
        .expect("applied")
        .into_inner();
    assert_eq!(
        (updated.user_id.as_str(), updated.applied),
        (second.as_str(), true)
    );
    let again = users
        .update_user(to(&first, update("u2", "Renamed", 2)))
        .await
        .expect("the saved answer");
    assert_eq!(
        again.metadata().get("idempotent-replayed"),
        Some(&MetadataValue::from_static("true"))
    );
    assert_eq!(again.into_inner().user_id, second);
    let disabled = users
        .disable_user(DisableUserRequest {
            user_id: second.clone(),
            ..disable("d3", 3)
        })
        .await
        .expect("applied")
        .into_inner();
    assert_eq!(
        (disabled.user_id.as_str(), disabled.applied),
        (second.as_str(), true)
    );
    let changed = user(&app, &second).await;
    assert_eq!(
        (
            changed.first_name.as_str(),
            changed.enabled,
            changed.source_version
        ),
        ("Renamed", false, 3)
    );
    let untouched = user(&app, &first).await;
    assert_eq!(
        (
            untouched.first_name.as_str(),
            untouched.enabled,
            untouched.source_version
        ),
        ("Ana", true, 1)
    );

    let before = users_and_inbox_rows(&app.users_db).await;
    let unknown = Uuid::now_v7().to_string();
    let status = users
        .update_user(to(&unknown, update("u4", "Other", 4)))
        .await
        .expect_err("no such user");
    assert_eq!(reason(&status), (Code::NotFound, "USER_NOT_FOUND".into()));
    assert_eq!(status.message(), format!("user {unknown} not found"));
    let status = users
        .disable_user(DisableUserRequest {
            user_id: someone_else.clone(),
            ..disable("d4", 4)
        })
        .await
        .expect_err("another student's user");
    assert_eq!(
        reason(&status),
        (Code::FailedPrecondition, "USER_OF_ANOTHER_STUDENT".into())
    );
    assert_eq!(
        status.message(),
        format!("user {someone_else} is not a user of student {STUDENT}")
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, before);
    let other = user(&app, &someone_else).await;
    assert_eq!((other.enabled, other.source_version), (true, 1));
}

/// README ("Three guarantees", the inbox): two racing first deliveries of one key are
/// decided by the inbox's primary key, the loser re-reading the winner's saved answer; for
/// changes as for creations. Thirty UpdateUsers with one key at once, then thirty
/// DisableUsers with another: every one answered alike (the user, applied), one inbox row
/// per key, and the user at each change's version.
async fn racing_first_deliveries_of_one_change_key_apply_it_once(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_user(&app).await;
    let updates = futures::future::join_all((0..30).map(|_| {
        let mut users = app.users.clone();
        async move { users.update_user(update("race-update", "Renamed", 2)).await }
    }))
    .await;
    for answer in updates {
        let answer = answer.expect("each race answered").into_inner();
        assert_eq!(
            (answer.user_id.as_str(), answer.applied),
            (id.as_str(), true)
        );
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 2));
    let renamed = user(&app, &id).await;
    assert_eq!(
        (renamed.first_name.as_str(), renamed.source_version),
        ("Renamed", 2)
    );

    let disables = futures::future::join_all((0..30).map(|_| {
        let mut users = app.users.clone();
        async move { users.disable_user(disable("race-disable", 3)).await }
    }))
    .await;
    for answer in disables {
        let answer = answer.expect("each race answered").into_inner();
        assert_eq!(
            (answer.user_id.as_str(), answer.applied),
            (id.as_str(), true)
        );
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 3));
    let disabled = user(&app, &id).await;
    assert_eq!((disabled.enabled, disabled.source_version), (false, 3));
}

/// README ("A student's whole life"): a change sent by hand, or late, never overwrites a
/// newer one, even when they race. Six rounds, each sending 39 versions of one user's
/// change at once (each with its own key, newest first; the user named in every other
/// round): each is judged against the user as
/// the one before it left it (the user row is locked for the judging), so every round
/// leaves the user at its newest version with its names, whatever order the commits took.
/// (Judged against what each read before the others committed, every one would apply, and
/// the last to commit would win: on PostgreSQL, most rounds then end elsewhere. SQLite's
/// one write lock serialises the changes whatever the code does, so there this test shows
/// the outcome, and only PostgreSQL tells whether the user row is locked.)
async fn racing_changes_of_one_user_leave_it_at_the_newest_version(backend: Backend) {
    const ROUNDS: u64 = 6;
    const PER_ROUND: u64 = 39;
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_user(&app).await;
    for round in 0..ROUNDS {
        let newest = 1 + PER_ROUND * (round + 1);
        let versions = (newest - PER_ROUND + 1)..=newest;
        // Odd rounds name the user, as the relay does (the user found by id); even ones
        // leave it to Users (the student's first user): each way locks the row it judges.
        let user_id = if round % 2 == 1 {
            id.clone()
        } else {
            String::new()
        };
        let answers = futures::future::join_all(versions.rev().map(|version| {
            let mut users = app.users.clone();
            let request = UpdateUserRequest {
                user_id: user_id.clone(),
                ..update(
                    &format!("change-v{version}"),
                    &format!("V{version}"),
                    version,
                )
            };
            async move { (version, users.update_user(request).await) }
        }))
        .await;
        for (version, answer) in answers {
            let answer = answer.expect("each change answered").into_inner();
            assert_eq!(answer.user_id, id, "version {version}");
            if version == newest {
                assert!(answer.applied, "the newest always applies");
            }
        }
        let now = user(&app, &id).await;
        assert_eq!(
            (now.first_name, now.source_version),
            (format!("V{newest}"), newest),
            "round {round}"
        );
    }
    assert_eq!(
        users_and_inbox_rows(&app.users_db).await,
        (1, 1 + ROUNDS * PER_ROUND)
    );
}
