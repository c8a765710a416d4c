//! users-svc through its gRPC surface: the inbox makes CreateUser idempotent.

use proto::users::v1::{CreateUserRequest, GetUserRequest, ListUsersRequest};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, sea_query::Expr};
use tonic::{Code, Request, metadata::MetadataValue};
use users_svc::entity::{
    inbox::{self, SavedOutcome},
    users,
};
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{
        Backend,
        app::{AppOptions, spawn_app_with},
        assert_key_reused,
        commit_trap::{lift_the_commit_trap, refuse_to_commit_inbox_rows},
        invariants::{stored_user, users_and_inbox_rows},
        pgbench, spawn_app,
    },
};

on_both_backends!(
    first_delivery_creates_one_user_and_one_inbox_row,
    repeated_delivery_returns_saved_user_id,
    key_reused_with_another_request_is_rejected_and_writes_nothing,
    a_replica_that_did_not_execute_a_key_answers_it_from_the_table_then_from_memory,
    an_answer_read_from_the_table_is_forgotten_when_its_row_may_be_purged,
    replay_only_request_never_creates,
    invalid_create_user_fields_are_named_and_nothing_is_stored,
    another_key_with_a_taken_document_number_is_rejected_and_the_rejection_replays,
    a_rejected_key_repeated_where_memory_does_not_know_it_keeps_its_rejection,
    a_rejection_whose_commit_failed_is_not_remembered,
    a_creation_whose_commit_failed_is_not_remembered,
    a_change_whose_commit_failed_is_not_remembered,
    get_user_returns_the_user_or_names_the_problem,
    list_users_returns_a_students_users_oldest_first_or_names_the_problem,
    list_users_without_a_student_pages_through_every_user,
    list_users_pages_default_to_50_and_hold_500_at_most,
    a_key_issued_before_the_inbox_horizon_is_answered_if_known_and_refused_if_not,
    a_malformed_key_time_is_refused_naming_it,
    the_scheduled_purge_deletes_only_keys_older_than_the_retention,
);

/// `message` under metadata `idempotency-key-created-at: issued_at`.
fn issued_at(message: CreateUserRequest, issued_at: &str) -> Request<CreateUserRequest> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "idempotency-key-created-at",
        issued_at.parse().expect("ASCII metadata"),
    );
    request
}

fn hours_ago(hours: i64) -> String {
    (chrono::Utc::now() - chrono::TimeDelta::hours(hours))
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

async fn a_key_issued_before_the_inbox_horizon_is_answered_if_known_and_refused_if_not(
    backend: Backend,
) {
    let options = AppOptions {
        inbox: users_svc::InboxSettings {
            retention: std::time::Duration::from_secs(3600),
            ..users_svc::InboxSettings::default()
        },
        ..AppOptions::default()
    };
    let Some(app) = spawn_app_with(backend, options).await else {
        return;
    };
    let mut users = app.users.clone();
    // Issued just now: executed as usual.
    let created = users
        .create_user(issued_at(request("key-1"), &hours_ago(0)))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    // The same key, said to be two hours old (past the one-hour retention) but still in the
    // inbox: its saved answer, as always.
    let again = users
        .create_user(issued_at(request("key-1"), &hours_ago(2)))
        .await
        .expect("answered from the inbox");
    assert!(again.metadata().get("idempotent-replayed").is_some());
    assert_eq!(again.into_inner().user_id, created);
    // A key that old and NOT in the inbox may have run and been purged: refused, nothing run.
    let mut other = request("key-2");
    other.document_number = "DOC-2002".into();
    other.email = "other@example.edu".into();
    let status = users
        .create_user(issued_at(other.clone(), &hours_ago(2)))
        .await
        .expect_err("expired");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        platform::status::reason(&status).as_deref(),
        Some("DELIVERY_EXPIRED")
    );
    assert!(
        status
            .message()
            .contains("longer ago than this service keeps its inbox (1h)"),
        "{}",
        status.message()
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
    // Asked replay-only, the same: not NOT_FOUND ("never executed", on which
    // `relay retry-failed --new-key` re-keys), since Users cannot tell. A replay-only
    // question about an old key it holds gets the saved answer.
    let replay_only = |mut request: Request<CreateUserRequest>| {
        request.metadata_mut().insert(
            "idempotency-replay-only",
            "true".parse().expect("ASCII metadata"),
        );
        request
    };
    let asked = users
        .create_user(replay_only(issued_at(other.clone(), &hours_ago(2))))
        .await
        .expect_err("expired, replay-only too");
    assert_eq!(
        (asked.code(), platform::status::reason(&asked).as_deref()),
        (Code::FailedPrecondition, Some("DELIVERY_EXPIRED"))
    );
    let known = users
        .create_user(replay_only(issued_at(request("key-1"), &hours_ago(2))))
        .await
        .expect("answered from the inbox");
    assert_eq!(known.into_inner().user_id, created);
    let young = users
        .create_user(replay_only(issued_at(other.clone(), &hours_ago(0))))
        .await
        .expect_err("a young key it does not hold never ran");
    assert_eq!(
        (young.code(), platform::status::reason(&young).as_deref()),
        (Code::NotFound, Some("NOT_IN_INBOX"))
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
    // The same request with a young key runs.
    users
        .create_user(issued_at(other, &hours_ago(0)))
        .await
        .expect("a young key runs");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (2, 2));
    // A call without the metadata (grpcurl, an older relay) has no age to judge: it runs.
    let mut unaged = request("key-3");
    unaged.document_number = "DOC-3003".into();
    unaged.email = "third@example.edu".into();
    users
        .create_user(unaged)
        .await
        .expect("no metadata, no horizon guard");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (3, 3));
}

async fn a_malformed_key_time_is_refused_naming_it(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let status = app
        .users
        .clone()
        .create_user(issued_at(request("key-1"), "yesterday"))
        .await
        .expect_err("not a time");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("idempotency-key-created-at"),
        "{}",
        status.message()
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

fn request(key: &str) -> CreateUserRequest {
    CreateUserRequest {
        idempotency_key: key.to_owned(),
        email: "ana.perez@example.edu".to_owned(),
        first_name: "Ana".to_owned(),
        last_name: "Pérez".to_owned(),
        document_number: "DOC-1001".to_owned(),
        student_id: "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a".to_owned(),
    }
}

/// An app where [`request`]`("first-key")` created a user: its document number is taken.
async fn app_with_a_document_holder(backend: Backend) -> Option<crate::support::TestApp> {
    let app = spawn_app(backend).await?;
    app.users
        .clone()
        .create_user(request("first-key"))
        .await
        .expect("created");
    Some(app)
}

/// Another student's request under `key`, with the document number [`request`] sends.
fn another_student_same_document(key: &str) -> CreateUserRequest {
    CreateUserRequest {
        student_id: "0193a6a4-0000-7c1a-9a55-3c2f1e0d4b8a".to_owned(),
        ..request(key)
    }
}

fn replay_only(message: CreateUserRequest) -> Request<CreateUserRequest> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "idempotency-replay-only",
        MetadataValue::from_static("true"),
    );
    request
}

async fn first_delivery_creates_one_user_and_one_inbox_row(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let response = app
        .users
        .clone()
        .create_user(request("key-1"))
        .await
        .expect("created");
    assert!(
        response.metadata().get("idempotent-replayed").is_none(),
        "first execution is not a replay"
    );
    let user_id = Uuid::parse_str(&response.into_inner().user_id).expect("uuid user id");

    let user = stored_user(&app.users_db, user_id).await;
    assert_eq!(
        (
            user.email.as_str(),
            user.first_name.as_str(),
            user.last_name.as_str(),
            user.document_number.as_str()
        ),
        ("ana.perez@example.edu", "Ana", "Pérez", "DOC-1001")
    );
    assert_eq!(
        user.student_id.to_string(),
        "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a"
    );
    assert!(user.enabled);
    let entry = inbox::Entity::find_by_id("key-1".to_owned())
        .one(&app.users_db)
        .await
        .expect("query")
        .expect("inbox row");
    assert_eq!(entry.request_hash.len(), 64);
    assert_eq!(
        serde_json::from_value::<SavedOutcome>(entry.result).expect("outcome"),
        SavedOutcome::Created { user_id }
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
}

async fn repeated_delivery_returns_saved_user_id(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let first = users
        .create_user(request("key-1"))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    for _ in 0..3 {
        let again = users.create_user(request("key-1")).await.expect("replayed");
        assert_eq!(
            again
                .metadata()
                .get("idempotent-replayed")
                .map(|v| v.to_str().ok()),
            Some(Some("true"))
        );
        assert_eq!(again.into_inner().user_id, first);
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
}

async fn key_reused_with_another_request_is_rejected_and_writes_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let first = users
        .create_user(request("key-1"))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    let mut other = request("key-1");
    other.email = "someone.else@example.edu".to_owned();
    let status = users.create_user(other).await.expect_err("key reused");
    assert_key_reused(&status);
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
    // The original request still gets its saved answer.
    let again = users
        .create_user(request("key-1"))
        .await
        .expect("replayed")
        .into_inner()
        .user_id;
    assert_eq!(again, first);
}

/// Each users-svc remembers recent inbox answers. A replica that did not execute a key
/// reads the saved answer from the table and remembers the first request's fingerprint,
/// never the caller's: a reused key is refused, and the original request, repeated, gets
/// the saved answer, from the table and then from memory.
async fn a_replica_that_did_not_execute_a_key_answers_it_from_the_table_then_from_memory(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let first = app
        .users
        .clone()
        .create_user(request("key-1"))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    let mut replica = app.users_replica().await;
    let mut other = request("key-1");
    other.email = "someone.else@example.edu".to_owned();
    // The replica reads the key's row from the table to refuse this (and remembers it).
    let status = replica.create_user(other).await.expect_err("key reused");
    assert_eq!(status.code(), Code::FailedPrecondition);
    // The row gone from the table (as a purge would take it): whatever answers the key
    // now answers from memory, the replica after its read, the first server after its
    // commit. Neither executes it again.
    app.users_db
        .execute_unprepared("DELETE FROM inbox WHERE idempotency_key = 'key-1'")
        .await
        .expect("delete the inbox row");
    for mut users in [replica.clone(), replica, app.users.clone()] {
        let again = users.create_user(request("key-1")).await.expect("replayed");
        assert!(again.metadata().get("idempotent-replayed").is_some());
        assert_eq!(again.into_inner().user_id, first);
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 0));
}

/// A replica remembers an answer it read from the table for as long as the row itself
/// may live (`--inbox-retention` from the row's `created_at`), not a full retention from
/// the read: memory never outlives the table, so replicas never disagree about a key the
/// table may have purged. Here the row is three seconds from its purge age when read.
async fn an_answer_read_from_the_table_is_forgotten_when_its_row_may_be_purged(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let first = app
        .users
        .clone()
        .create_user(request("old-key"))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    let retention = users_svc::InboxSettings::default().retention;
    let nearly_purgeable = platform::db::now()
        - chrono::Duration::from_std(retention).expect("retention")
        + chrono::Duration::seconds(3);
    inbox::Entity::update_many()
        .col_expr(inbox::Column::CreatedAt, Expr::value(nearly_purgeable))
        .exec(&app.users_db)
        .await
        .expect("age the row");
    let mut replica = app.users_replica().await;
    let read = replica
        .create_user(replay_only(request("old-key")))
        .await
        .expect("from the table")
        .into_inner();
    assert_eq!(read.user_id, first);
    // The row gone (as the purge will take it): the replica answers from memory until the
    // row's purge age, then asks the table and finds nothing.
    app.users_db
        .execute_unprepared("DELETE FROM inbox WHERE idempotency_key = 'old-key'")
        .await
        .expect("delete the inbox row");
    let forgotten = crate::support::eventually(
        "the replica to forget the answer",
        std::time::Duration::from_secs(30),
        || {
            let (mut replica, first) = (replica.clone(), first.clone());
            async move {
                match replica.create_user(replay_only(request("old-key"))).await {
                    Ok(answer) => {
                        assert_eq!(answer.into_inner().user_id, first, "from memory");
                        None
                    }
                    Err(status) => Some(status),
                }
            }
        },
    )
    .await;
    assert_eq!(forgotten.code(), Code::NotFound, "{forgotten:?}");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 0));
}

async fn replay_only_request_never_creates(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let status = users
        .create_user(replay_only(request("unknown")))
        .await
        .expect_err("unknown key");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
    // The header's value is read without regard to case, as HTTP headers' often are: a
    // client writing `TRUE` asked for a replay too, and must never create.
    for value in ["TRUE", "True"] {
        let mut request = Request::new(request("unknown"));
        request
            .metadata_mut()
            .insert("idempotency-replay-only", MetadataValue::from_static(value));
        let status = users.create_user(request).await.expect_err(value);
        assert_eq!(status.code(), Code::NotFound, "{value}");
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    let created = users
        .create_user(request("known"))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    let replayed = users
        .create_user(replay_only(request("known")))
        .await
        .expect("from inbox");
    assert_eq!(
        replayed
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert_eq!(replayed.into_inner().user_id, created);
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
}

async fn invalid_create_user_fields_are_named_and_nothing_is_stored(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let cases: Vec<(&str, Spoil, &str)> = vec![
        (
            "idempotency_key",
            |r| r.idempotency_key.clear(),
            "invalid idempotency_key: must not be empty",
        ),
        (
            "idempotency_key",
            |r| r.idempotency_key = "has space".into(),
            "invalid idempotency_key: must contain only letters, digits and '.', '_', ':', '-'",
        ),
        (
            "idempotency_key",
            |r| r.idempotency_key = "k".repeat(129),
            "invalid idempotency_key: must be at most 128 characters",
        ),
        (
            "email",
            |r| r.email = "ana@".into(),
            "invalid email: must be an e-mail address like name@example.org",
        ),
        (
            "first_name",
            |r| r.first_name = " Ana".into(),
            "invalid first_name: must not start or end with whitespace",
        ),
        (
            "last_name",
            |r| r.last_name = "P\u{0}rez".into(),
            "invalid last_name: must not contain control characters",
        ),
        (
            "last_name",
            |r| r.last_name = "x".repeat(101),
            "invalid last_name: must be at most 100 characters",
        ),
        (
            "document_number",
            |r| r.document_number = "1001;".into(),
            "invalid document_number: must contain only letters, digits and '-'",
        ),
        (
            "student_id",
            |r| r.student_id = "42".into(),
            "invalid student_id: must be a hyphenated UUID",
        ),
    ];
    for (field, spoil, message) in cases {
        let mut bad = request("key-1");
        spoil(&mut bad);
        let status = app.users.clone().create_user(bad).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert_eq!(status.message(), message, "{field}");
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

async fn another_key_with_a_taken_document_number_is_rejected_and_the_rejection_replays(
    backend: Backend,
) {
    let Some(app) = app_with_a_document_holder(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let second = another_student_same_document("second-key");
    // The second key's inbox row was fine and its user was not: both are one statement on
    // PostgreSQL (one transaction on SQLite), so the inbox row must not stay and answer
    // "created" for a user that was never written.
    for replayed in [false, true] {
        let status = users
            .create_user(second.clone())
            .await
            .expect_err("document number taken");
        assert_eq!(status.code(), Code::AlreadyExists);
        assert_eq!(
            status.message(),
            "document_number is already used by another enabled user"
        );
        assert_eq!(
            status.metadata().get("idempotent-replayed").is_some(),
            replayed
        );
    }
    // One user, and two inbox rows: the second key's saved answer is the rejection.
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 2));
}

async fn a_rejected_key_repeated_where_memory_does_not_know_it_keeps_its_rejection(
    backend: Backend,
) {
    let Some(app) = app_with_a_document_holder(backend).await else {
        return;
    };
    let second = another_student_same_document("second-key");
    let status = app
        .users
        .clone()
        .create_user(second.clone())
        .await
        .expect_err("document number taken");
    assert_eq!(status.code(), Code::AlreadyExists);
    // The document number's holder is disabled: the same request under a new key would
    // now create a user.
    users::Entity::update_many()
        .col_expr(users::Column::Enabled, Expr::value(false))
        .exec(&app.users_db)
        .await
        .expect("disable the holder");
    // A replica never saw the second key, so it writes at once; its user could be written
    // now, but not its inbox row (the key's is there), and the two stand or fall together.
    let mut replica = app.users_replica().await;
    let status = replica
        .create_user(second)
        .await
        .expect_err("the saved rejection");
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(status.metadata().get("idempotent-replayed").is_some());
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 2));
}

async fn get_user_returns_the_user_or_names_the_problem(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let id = users
        .create_user(request("key-1"))
        .await
        .expect("created")
        .into_inner()
        .user_id;
    let user = users
        .get_user(GetUserRequest { id: id.clone() })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(
        (user.id.as_str(), user.email.as_str(), user.enabled),
        (id.as_str(), "ana.perez@example.edu", true)
    );
    assert_eq!(user.student_id, "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a");
    // Every field as stored, the creation time to the microsecond.
    let stored = stored_user(&app.users_db, Uuid::parse_str(&id).expect("uuid")).await;
    assert_eq!(
        (
            user.first_name.as_str(),
            user.last_name.as_str(),
            user.document_number.as_str(),
            user.source_version,
        ),
        ("Ana", "Pérez", "DOC-1001", 1)
    );
    assert_eq!(
        user.created_at
            .as_ref()
            .and_then(platform::timestamp::from_proto),
        Some(stored.created_at)
    );

    let unknown = Uuid::now_v7().to_string();
    let status = users
        .get_user(GetUserRequest {
            id: unknown.clone(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), format!("user {unknown} not found"));
    let status = users
        .get_user(GetUserRequest { id: "nope".into() })
        .await
        .expect_err("malformed");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "invalid id: must be a hyphenated UUID");
}

/// ListUsers returns every user of the student, disabled ones too, oldest first (not in
/// the order they were written: the first user's time is moved after the second's), each
/// as GetUser returns it; none of another student's; nothing for a student without users;
/// and names a malformed student id.
async fn list_users_returns_a_students_users_oldest_first_or_names_the_problem(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let student_id = request("key-1").student_id;
    let mut ids = Vec::new();
    for (key, document_number, student) in [
        ("key-1", "DOC-1001", student_id.as_str()),
        ("key-2", "DOC-1002", student_id.as_str()),
        ("key-3", "DOC-1003", "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8b"),
    ] {
        let created = users
            .create_user(CreateUserRequest {
                document_number: document_number.into(),
                student_id: student.into(),
                ..request(key)
            })
            .await
            .expect("created");
        ids.push(Uuid::parse_str(&created.into_inner().user_id).expect("uuid"));
    }
    // The first user is disabled, and now the newer of the two.
    users::Entity::update_many()
        .col_expr(users::Column::Enabled, Expr::value(false))
        .col_expr(
            users::Column::CreatedAt,
            Expr::value(chrono::Utc::now() + chrono::TimeDelta::hours(1)),
        )
        .filter(users::Column::Id.eq(ids[0]))
        .exec(&app.users_db)
        .await
        .expect("update the first user");
    let listed = users
        .list_users(ListUsersRequest {
            student_id: student_id.clone(),
            ..ListUsersRequest::default()
        })
        .await
        .expect("listed")
        .into_inner()
        .users;
    let mut expected = Vec::new();
    for id in [ids[1], ids[0]] {
        let user = users
            .get_user(GetUserRequest { id: id.to_string() })
            .await
            .expect("found")
            .into_inner();
        expected.push(user);
    }
    assert_eq!(listed, expected);
    assert_eq!(
        listed.iter().map(|user| user.enabled).collect::<Vec<_>>(),
        [true, false]
    );

    let none = users
        .list_users(ListUsersRequest {
            student_id: Uuid::now_v7().to_string(),
            ..ListUsersRequest::default()
        })
        .await
        .expect("listed")
        .into_inner();
    assert!(none.users.is_empty(), "{none:?}");
    let status = users
        .list_users(ListUsersRequest {
            student_id: "nope".into(),
            ..ListUsersRequest::default()
        })
        .await
        .expect_err("malformed");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "invalid student_id: must be a hyphenated UUID"
        )
    );
}

/// ListUsers without a student pages through every user in id order, each as GetUser
/// returns it: the next_page_token continues after the last user of a page, and is empty
/// on the last; a page token is refused beside a student id, as are a negative size and a
/// malformed token.
async fn list_users_without_a_student_pages_through_every_user(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let mut ids = Vec::new();
    for n in 0..5 {
        let created = users
            .create_user(CreateUserRequest {
                document_number: format!("DOC-{n}"),
                student_id: Uuid::now_v7().to_string(),
                ..request(&format!("key-{n}"))
            })
            .await
            .expect("created");
        ids.push(created.into_inner().user_id);
    }
    ids.sort();
    let page = |page_size: i32, page_token: &str| ListUsersRequest {
        student_id: String::new(),
        page_size,
        page_token: page_token.into(),
    };

    let mut listed = Vec::new();
    let mut tokens = Vec::new();
    let mut token = String::new();
    loop {
        let answer = users
            .list_users(page(2, &token))
            .await
            .expect("a page")
            .into_inner();
        assert!(answer.users.len() <= 2, "{answer:?}");
        listed.extend(answer.users);
        token = answer.next_page_token;
        if token.is_empty() {
            break;
        }
        tokens.push(token.clone());
    }
    let listed_ids: Vec<String> = listed.iter().map(|user| user.id.clone()).collect();
    assert_eq!(listed_ids, ids);
    assert_eq!(tokens, [ids[1].clone(), ids[3].clone()]);
    for user in &listed {
        let found = users
            .get_user(GetUserRequest {
                id: user.id.clone(),
            })
            .await
            .expect("found")
            .into_inner();
        assert_eq!(&found, user);
    }
    // Size 0 is the default page (50): all five, and no next page.
    let all = users
        .list_users(page(0, ""))
        .await
        .expect("a page")
        .into_inner();
    assert_eq!((all.users.len(), all.next_page_token.as_str()), (5, ""));
    // A page the users left exactly fill is the last one: no token to an empty page.
    let exact = users
        .list_users(page(5, ""))
        .await
        .expect("a page")
        .into_inner();
    assert_eq!((exact.users.len(), exact.next_page_token.as_str()), (5, ""));

    for (request, field, message) in [
        (
            ListUsersRequest {
                student_id: Uuid::now_v7().to_string(),
                page_size: 0,
                page_token: ids[0].clone(),
            },
            "page_token",
            "invalid page_token: must be empty with student_id: a student's users come in one response",
        ),
        (
            page(-1, ""),
            "page_size",
            "invalid page_size: must not be negative",
        ),
        (
            ListUsersRequest {
                student_id: Uuid::now_v7().to_string(),
                page_size: -1,
                page_token: String::new(),
            },
            "page_size",
            "invalid page_size: must not be negative",
        ),
        (
            page(2, "nope"),
            "page_token",
            "invalid page_token: must be a hyphenated UUID",
        ),
    ] {
        let status = users.list_users(request).await.expect_err("refused");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message),
            "{field}"
        );
        assert_eq!(
            platform::status::invalid_field(&status).as_deref(),
            Some(field)
        );
    }
}

/// The same page sizes as ListStudents: 50 when the request names none, 500 at most.
async fn list_users_pages_default_to_50_and_hold_500_at_most(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    crate::support::insert_users_of_no_student(
        &app.users_db,
        (0..501).map(|_| Uuid::now_v7()),
        true,
    )
    .await;
    let page = |page_size, page_token: &str| {
        let request = ListUsersRequest {
            student_id: String::new(),
            page_size,
            page_token: page_token.to_owned(),
        };
        let mut users = app.users.clone();
        async move { users.list_users(request).await.expect("page").into_inner() }
    };
    let default = page(0, "").await;
    assert_eq!(default.users.len(), 50);
    assert!(!default.next_page_token.is_empty());
    let capped = page(1000, "").await;
    assert_eq!(capped.users.len(), 500);
    let rest = page(1000, &capped.next_page_token).await;
    assert_eq!(rest.users.len(), 1);
    assert!(rest.next_page_token.is_empty());
}

/// Turns a valid request into one with a single invalid field.
type Spoil = fn(&mut CreateUserRequest);

/// The database-only ceiling's CreateUser (`bench/pgbench/create_user.sql`) writes what
/// users-svc writes for a first delivery on PostgreSQL: one statement, the user in a
/// `WITH` and its inbox row after it, into the same columns. Its CreateUsers
/// (`create_users.sql`) writes the same columns for as many users a statement as a relay
/// sends in one call by default.
#[test]
fn the_pgbench_create_user_scripts_write_the_columns_the_service_writes() {
    let new = |n: usize| users_svc::NewUser {
        idempotency_key: format!("key-{n}"),
        email: "ada@example.edu".into(),
        first_name: "Ada".into(),
        last_name: "Lovelace".into(),
        document_number: format!("D-{n}"),
        student_id: Uuid::now_v7(),
    };
    let one = users_svc::create_user::create_statement(&[new(1)])
        .expect("a statement")
        .sql;
    let many = users_svc::create_user::create_statement(&[new(1), new(2)])
        .expect("a statement")
        .sql;
    let (single, batch) = (
        pgbench::script("create_user.sql"),
        pgbench::script("create_users.sql"),
    );
    for sql in [&one, &many, &single, &batch] {
        assert!(pgbench::inserts_both_in_one_statement(sql), "{sql}");
    }
    assert_eq!(pgbench::inserts(&single), pgbench::inserts(&one));
    assert_eq!(pgbench::inserts(&batch), pgbench::inserts(&many));
    let per_call = relay::RunConfig::default().rows_per_call;
    assert_eq!(
        batch
            .matches(&format!("generate_series(1, {per_call})"))
            .count(),
        2,
        "{batch}"
    );
}

/// README ("an answer is remembered only after its commit"): a rejection whose commit
/// failed is not in the table, so this process must not answer it from memory either.
async fn a_rejection_whose_commit_failed_is_not_remembered(backend: Backend) {
    let Some(app) = app_with_a_document_holder(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    // The database refuses to commit the second key's inbox row: its insert passes, and
    // the commit after it fails.
    refuse_to_commit_inbox_rows(&app.users_db, backend, Some("second-key")).await;
    let second = another_student_same_document("second-key");
    let status = users
        .create_user(second.clone())
        .await
        .expect_err("the rejection's commit fails");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
    // Now the document number is free, and nothing saved an answer under the key: the
    // same process must judge it again (and create the user), not answer the rejection
    // it would have saved from memory.
    lift_the_commit_trap(&app.users_db, backend).await;
    users::Entity::update_many()
        .col_expr(users::Column::Enabled, Expr::value(false))
        .exec(&app.users_db)
        .await
        .expect("disable the holder");
    let created = users
        .create_user(second)
        .await
        .expect("created: the failed rejection was not remembered")
        .into_inner();
    assert!(Uuid::parse_str(&created.user_id).is_ok());
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (2, 2));
}

/// README ("Inbox"): an answer is remembered only after its commit. A CreateUser whose
/// commit the database refuses answers INTERNAL and stores nothing; sent again once the
/// database commits, the same process creates the user then (a user that exists), rather
/// than answer from memory with the id of a user that was never stored.
async fn a_creation_whose_commit_failed_is_not_remembered(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    refuse_to_commit_inbox_rows(&app.users_db, backend, Some("create-key")).await;
    let status = users
        .create_user(request("create-key"))
        .await
        .expect_err("the creation's commit fails");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
    lift_the_commit_trap(&app.users_db, backend).await;
    let created = users
        .create_user(request("create-key"))
        .await
        .expect("created now")
        .into_inner();
    let user = stored_user(
        &app.users_db,
        Uuid::parse_str(&created.user_id).expect("uuid"),
    )
    .await;
    assert_eq!(user.first_name, "Ana");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 1));
}

/// The same for a change: an UpdateUser whose commit the database refuses changes nothing;
/// sent again once the database commits, it is applied then, not answered `applied` from
/// memory while the user keeps its old name.
async fn a_change_whose_commit_failed_is_not_remembered(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut users = app.users.clone();
    let created = users
        .create_user(request("create-key"))
        .await
        .expect("created")
        .into_inner();
    let user_id = Uuid::parse_str(&created.user_id).expect("uuid");
    let rename = proto::users::v1::UpdateUserRequest {
        idempotency_key: "rename-key".into(),
        student_id: request("create-key").student_id,
        first_name: "Renamed".into(),
        last_name: "Pérez".into(),
        email: "ana.perez@example.edu".into(),
        source_version: 2,
        user_id: created.user_id.clone(),
    };
    refuse_to_commit_inbox_rows(&app.users_db, backend, Some("rename-key")).await;
    let status = users
        .update_user(rename.clone())
        .await
        .expect_err("the change's commit fails");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    let unchanged = stored_user(&app.users_db, user_id).await;
    assert_eq!(
        (unchanged.first_name.as_str(), unchanged.source_version),
        ("Ana", 1)
    );
    lift_the_commit_trap(&app.users_db, backend).await;
    let applied = users
        .update_user(rename)
        .await
        .expect("applied now")
        .into_inner();
    assert!(applied.applied, "{applied:?}");
    let renamed = stored_user(&app.users_db, user_id).await;
    assert_eq!(
        (renamed.first_name.as_str(), renamed.source_version),
        ("Renamed", 2)
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 2));
}

/// The server's own purge, run every `purge_interval`, deletes by `--inbox-retention`: a
/// key past it goes, a key younger than it stays however many purges run (were it
/// deleted, its late delivery would create a second user).
async fn the_scheduled_purge_deletes_only_keys_older_than_the_retention(backend: Backend) {
    let options = AppOptions {
        inbox: users_svc::InboxSettings {
            retention: std::time::Duration::from_secs(3600),
            purge_interval: std::time::Duration::from_millis(100),
            ..users_svc::InboxSettings::default()
        },
        ..AppOptions::default()
    };
    let Some(app) = spawn_app_with(backend, options).await else {
        return;
    };
    let mut users = app.users.clone();
    let mut ids = Vec::new();
    for (n, key) in ["young", "old"].into_iter().enumerate() {
        let created = users
            .create_user(CreateUserRequest {
                document_number: format!("DOC-{n}"),
                ..request(key)
            })
            .await
            .expect("created");
        ids.push(created.into_inner().user_id);
    }
    // `young` made a minute ago: older than many purge intervals, well inside the
    // retention; `old` two hours ago, past it.
    for (key, made) in [
        ("young", chrono::Utc::now() - chrono::TimeDelta::minutes(1)),
        ("old", chrono::Utc::now() - chrono::TimeDelta::hours(2)),
    ] {
        inbox::Entity::update_many()
            .col_expr(inbox::Column::CreatedAt, Expr::value(made))
            .filter(inbox::Column::IdempotencyKey.eq(key))
            .exec(&app.users_db)
            .await
            .expect("date the key");
    }
    // A purge ran once `old` is gone.
    crate::support::eventually(
        "the purge deletes the old key",
        std::time::Duration::from_secs(30),
        || async {
            (inbox::Entity::find_by_id("old")
                .one(&app.users_db)
                .await
                .expect("read the inbox")
                .is_none())
            .then_some(())
        },
    )
    .await;
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (2, 1));
    // Its late delivery, at a replica that never saw it, is answered from the table.
    let again = app
        .users_replica()
        .await
        .create_user(CreateUserRequest {
            document_number: "DOC-0".into(),
            ..request("young")
        })
        .await
        .expect("answered");
    assert_eq!(again.into_inner().user_id, ids[0]);
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (2, 1));
}
