//! Property tests: random and hostile strings (control characters, huge, empty,
//! non-ASCII, SQL, surrounding whitespace) in every request field of every RPC. The answer
//! is OK, or INVALID_ARGUMENT with a field violation naming that field; the server never
//! panics; a rejected request stores nothing and an accepted one stores exactly its rows.

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use proto::{
    student::v1::{
        CreateStudentRequest, DeactivateStudentRequest, GetStudentRequest, ListStudentsRequest,
        Student, UpdateStudentRequest,
    },
    users::v1::{
        CreateUserRequest, CreateUsersItem, CreateUsersRequest, DisableUserRequest, GetUserRequest,
        ListUsersRequest, UpdateUserRequest, create_users_result::Outcome,
    },
};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use crate::support::{
    Backend, TestApp,
    invariants::{students_and_outbox_rows, users_and_inbox_rows},
    spawn_app, student_request,
};

/// Declares `NAME::sqlite` and `NAME::postgres` for a synchronous property `fn NAME(Backend)`.
macro_rules! property_on_both_backends {
    ($($property:ident),* $(,)?) => {$(
        mod $property {
            #[test]
            fn sqlite() {
                super::$property($crate::support::Backend::Sqlite)
            }

            #[test]
            fn postgres() {
                super::$property($crate::support::Backend::Postgres)
            }
        }
    )*};
}

property_on_both_backends!(
    create_user_fields_are_accepted_or_named,
    create_users_items_are_accepted_or_named_each_on_its_own,
    create_student_fields_are_accepted_or_named,
    update_student_fields_are_accepted_or_named,
    update_user_fields_are_accepted_or_named,
    deactivate_student_and_disable_user_fields_are_accepted_or_named,
    lookup_ids_and_page_tokens_are_accepted_or_named,
);

/// Cases per property and backend: enough variety to find a gap, quick enough for CI.
const CASES: u32 = 64;

fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        any::<String>(),
        "\\PC{0,120}",
        "[ \\t\\n\\r\\x00-\\x1f\\x7f\\u{a0}]{0,2}[A-Za-z0-9@.:_-]{1,12}[ \\t\\n\\x00]{0,2}",
        "[A-Za-z0-9._:-]{120,136}",
        ".{95,105}",
        "[A-Za-z0-9]{1,10}@[a-z]{1,8}\\.[a-z]{2,4}",
        "x{200,3000}",
        prop::sample::select(vec![
            "'; DROP TABLE users; --",
            "\" OR 1=1 --",
            "Robert'); DROP TABLE students;--",
            "ana@example.edu\u{0}",
            "𝓐𝓷𝓪 Пérez 李",
            "\u{202e}evil",
            "null",
            "../../etc/passwd",
            "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a",
        ])
        .prop_map(str::to_owned),
    ]
}

type Check<'a> = Pin<Box<dyn Future<Output = Result<(), TestCaseError>> + 'a>>;

/// Runs `check` on `CASES` generated values against one app on `backend`.
fn run_property<S: Strategy>(
    backend: Backend,
    strategy: S,
    check: impl Fn(&TestApp, S::Value, usize) -> Check<'_>,
) where
    S::Value: std::fmt::Debug,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let Some(app) = runtime.block_on(spawn_app(backend)) else {
        return;
    };
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |value| {
        runtime.block_on(check(&app, value, case.fetch_add(1, Ordering::Relaxed)))
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    assert_eq!(
        case.load(Ordering::Relaxed),
        CASES as usize,
        "every case ran"
    );
}

/// Asserts `status` is INVALID_ARGUMENT whose single field violation names `field`.
fn names_field(status: &Status, field: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(status.code(), Code::InvalidArgument, "{:?}", status);
    let violations = status
        .get_details_bad_request()
        .map(|b| b.field_violations)
        .unwrap_or_default();
    prop_assert_eq!(violations.len(), 1, "{:?}", status);
    prop_assert_eq!(violations[0].field.as_str(), field);
    Ok(())
}

const USER_FIELDS: [&str; 6] = [
    "idempotency_key",
    "email",
    "first_name",
    "last_name",
    "document_number",
    "student_id",
];

/// The `n`th case's valid CreateUser request: its own key and document number.
fn valid_user(n: usize) -> CreateUserRequest {
    CreateUserRequest {
        idempotency_key: format!("prop-{n}"),
        email: "ana@example.edu".into(),
        first_name: "Ana".into(),
        last_name: "Pérez".into(),
        document_number: format!("DOC-P{n}"),
        student_id: "0193a6a4-7f3e-7c1a-9a55-3c2f1e0d4b8a".into(),
    }
}

/// [`valid_user`] with `USER_FIELDS[field]` set to `value`.
fn spoiled_user(n: usize, field: usize, value: &str) -> CreateUserRequest {
    let mut request = valid_user(n);
    let slot = match field {
        0 => &mut request.idempotency_key,
        1 => &mut request.email,
        2 => &mut request.first_name,
        3 => &mut request.last_name,
        4 => &mut request.document_number,
        _ => &mut request.student_id,
    };
    value.clone_into(slot);
    request
}

fn create_user_fields_are_accepted_or_named(backend: Backend) {
    let accepted = Arc::new(Mutex::new(HashSet::new()));
    run_property(
        backend,
        (0..USER_FIELDS.len(), hostile()),
        |app, (field, value), n| {
            let accepted = accepted.clone();
            Box::pin(async move {
                let request = spoiled_user(n, field, &value);
                let before = users_and_inbox_rows(&app.users_db).await;
                let answer = app.users.clone().create_user(request).await;
                let after = users_and_inbox_rows(&app.users_db).await;
                let seen_before = !accepted
                    .lock()
                    .expect("lock")
                    .insert((field, value.clone()));
                match answer {
                    Ok(response) if response.metadata().get("idempotent-replayed").is_some() => {
                        prop_assert!(seen_before, "a replay only for a key already used");
                        prop_assert_eq!(after, before);
                    }
                    Ok(_) => prop_assert_eq!(
                        after,
                        (before.0 + 1, before.1 + 1),
                        "one user and one inbox row"
                    ),
                    Err(status) if status.code() == Code::InvalidArgument => {
                        accepted.lock().expect("lock").remove(&(field, value));
                        names_field(&status, USER_FIELDS[field])?;
                        prop_assert_eq!(after, before, "nothing stored");
                    }
                    // The same random value, valid, twice: the domain and the inbox answer.
                    Err(status)
                        if seen_before && field == 4 && status.code() == Code::AlreadyExists =>
                    {
                        prop_assert_eq!(
                            after,
                            (before.0, before.1 + 1),
                            "only the saved rejection"
                        );
                    }
                    Err(status)
                        if seen_before
                            && field == 0
                            && status.code() == Code::FailedPrecondition =>
                    {
                        prop_assert_eq!(after, before);
                    }
                    Err(status) => prop_assert!(false, "unexpected answer {:?}", status),
                }
                Ok(())
            })
        },
    );
}

/// CreateUsers: a hostile value in one field of one item, beside a valid item. The valid
/// item is created whatever its neighbour is; the hostile one is created, replayed, or
/// refused in its own result naming its field, storing nothing.
fn create_users_items_are_accepted_or_named_each_on_its_own(backend: Backend) {
    let accepted = Arc::new(Mutex::new(HashSet::new()));
    run_property(
        backend,
        (0..USER_FIELDS.len(), hostile()),
        |app, (field, value), n| {
            let accepted = accepted.clone();
            Box::pin(async move {
                let hostile = spoiled_user(n, field, &value);
                let neighbour = CreateUserRequest {
                    idempotency_key: format!("prop-ok-{n}"),
                    document_number: format!("DOC-OK{n}"),
                    ..valid_user(n)
                };
                let request = CreateUsersRequest {
                    items: [hostile, neighbour]
                        .map(|user| CreateUsersItem {
                            user: Some(user),
                            ..CreateUsersItem::default()
                        })
                        .into(),
                };
                let before = users_and_inbox_rows(&app.users_db).await;
                let answer = app.users.clone().create_users(request).await;
                let after = users_and_inbox_rows(&app.users_db).await;
                let results = answer
                    .map_err(|status| {
                        TestCaseError::fail(format!("no item may fail the whole call: {status:?}"))
                    })?
                    .into_inner()
                    .results;
                prop_assert_eq!(results.len(), 2);
                prop_assert!(
                    matches!(results[1].outcome, Some(Outcome::UserId(_))) && !results[1].replayed,
                    "the valid item is created: {:?}",
                    results[1]
                );
                let seen_before = !accepted
                    .lock()
                    .expect("lock")
                    .insert((field, value.clone()));
                // The neighbour's user and inbox row, plus what the hostile item stored.
                let stored = (after.0 - before.0 - 1, after.1 - before.1 - 1);
                match &results[0].outcome {
                    Some(Outcome::UserId(_)) if results[0].replayed => {
                        prop_assert!(seen_before, "a replay only for a key already used");
                        prop_assert_eq!(stored, (0, 0));
                    }
                    Some(Outcome::UserId(_)) => {
                        prop_assert_eq!(stored, (1, 1), "one user and one inbox row");
                    }
                    Some(Outcome::Error(error)) if error.code == Code::InvalidArgument as i32 => {
                        accepted.lock().expect("lock").remove(&(field, value));
                        let named = format!("invalid {}:", USER_FIELDS[field]);
                        prop_assert!(error.message.starts_with(&named), "{:?}", error);
                        prop_assert_eq!(stored, (0, 0), "nothing stored");
                    }
                    // The same random value, valid, twice: the domain and the inbox answer.
                    Some(Outcome::Error(error))
                        if seen_before
                            && field == 4
                            && error.code == Code::AlreadyExists as i32 =>
                    {
                        prop_assert_eq!(stored, (0, 1), "only the saved rejection");
                    }
                    Some(Outcome::Error(error))
                        if seen_before
                            && field == 0
                            && error.code == Code::FailedPrecondition as i32 =>
                    {
                        prop_assert_eq!(stored, (0, 0));
                    }
                    other => prop_assert!(false, "unexpected answer {:?}", other),
                }
                Ok(())
            })
        },
    );
}

const STUDENT_FIELDS: [&str; 5] = [
    "first_name",
    "last_name",
    "email",
    "document_number",
    "idempotency_key",
];

fn create_student_fields_are_accepted_or_named(backend: Backend) {
    let accepted = Arc::new(Mutex::new(HashSet::new()));
    run_property(
        backend,
        (0..STUDENT_FIELDS.len(), hostile()),
        |app, (field, value), n| {
            let accepted = accepted.clone();
            Box::pin(async move {
                let mut request = CreateStudentRequest {
                    idempotency_key: Some(format!("prop-{n}")),
                    ..student_request(n)
                };
                match field {
                    0 => request.first_name = value.clone(),
                    1 => request.last_name = value.clone(),
                    2 => request.email = value.clone(),
                    3 => request.document_number = value.clone(),
                    _ => request.idempotency_key = Some(value.clone()),
                }
                let before = students_and_outbox_rows(&app.student_db).await;
                let answer = app.student.clone().create_student(request).await;
                let after = students_and_outbox_rows(&app.student_db).await;
                let seen_before = !accepted
                    .lock()
                    .expect("lock")
                    .insert((field, value.clone()));
                match answer {
                    Ok(_) => prop_assert_eq!(
                        after,
                        (before.0 + 1, before.1 + 1),
                        "one student and one outbox row"
                    ),
                    Err(status) if status.code() == Code::InvalidArgument => {
                        accepted.lock().expect("lock").remove(&(field, value));
                        names_field(&status, STUDENT_FIELDS[field])?;
                        prop_assert_eq!(after, before, "nothing stored");
                    }
                    Err(status)
                        if seen_before && field == 3 && status.code() == Code::AlreadyExists =>
                    {
                        prop_assert_eq!(after, before);
                    }
                    Err(status)
                        if seen_before
                            && field == 4
                            && status.code() == Code::FailedPrecondition =>
                    {
                        prop_assert_eq!(after, before);
                    }
                    Err(status) => prop_assert!(false, "unexpected answer {:?}", status),
                }
                Ok(())
            })
        },
    );
}

/// The `n`th case's own student, for a property that changes one.
async fn case_student(app: &TestApp, n: usize) -> Result<Student, TestCaseError> {
    app.student
        .clone()
        .create_student(student_request(n))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| TestCaseError::fail(format!("create: {status:?}")))
}

const UPDATE_STUDENT_FIELDS: [&str; 5] =
    ["id", "first_name", "last_name", "email", "idempotency_key"];

fn update_student_fields_are_accepted_or_named(backend: Backend) {
    let keys = Arc::new(Mutex::new(HashSet::new()));
    run_property(
        backend,
        (0..UPDATE_STUDENT_FIELDS.len(), hostile()),
        |app, (field, value), n| {
            let keys = keys.clone();
            Box::pin(async move {
                let student = case_student(app, n).await?;
                let mut request = UpdateStudentRequest {
                    id: student.id.clone(),
                    first_name: "Changed".into(),
                    last_name: "Name".into(),
                    email: format!("changed.{n}@example.edu"),
                    idempotency_key: Some(format!("prop-change-{n}")),
                    expected_version: 0,
                };
                match field {
                    0 => request.id = value.clone(),
                    1 => request.first_name = value.clone(),
                    2 => request.last_name = value.clone(),
                    3 => request.email = value.clone(),
                    _ => request.idempotency_key = Some(value.clone()),
                }
                let key = request.idempotency_key.clone();
                let before = students_and_outbox_rows(&app.student_db).await;
                let answer = app.student.clone().update_student(request).await;
                let after = students_and_outbox_rows(&app.student_db).await;
                match answer {
                    Ok(updated) => {
                        prop_assert_eq!(updated.into_inner().version, 2);
                        prop_assert_eq!(after, (before.0, before.1 + 1), "one outbox row");
                        keys.lock().expect("lock").insert(key);
                    }
                    Err(status) if status.code() == Code::InvalidArgument => {
                        names_field(&status, UPDATE_STUDENT_FIELDS[field])?;
                        prop_assert_eq!(after, before, "nothing stored");
                    }
                    // A well-formed id of no student.
                    Err(status) if field == 0 && status.code() == Code::NotFound => {
                        prop_assert_eq!(after, before);
                    }
                    // The same random key twice, with another request.
                    Err(status)
                        if field == 4
                            && status.code() == Code::FailedPrecondition
                            && keys.lock().expect("lock").contains(&key) =>
                    {
                        prop_assert_eq!(after, before);
                    }
                    Err(status) => prop_assert!(false, "unexpected answer {:?}", status),
                }
                Ok(())
            })
        },
    );
}

const UPDATE_USER_FIELDS: [&str; 5] = [
    "idempotency_key",
    "student_id",
    "first_name",
    "last_name",
    "email",
];

fn update_user_fields_are_accepted_or_named(backend: Backend) {
    let keys = Arc::new(Mutex::new(HashSet::new()));
    run_property(
        backend,
        (0..UPDATE_USER_FIELDS.len(), hostile()),
        |app, (field, value), n| {
            let keys = keys.clone();
            Box::pin(async move {
                let student_id = uuid::Uuid::now_v7().to_string();
                app.users
                    .clone()
                    .create_user(CreateUserRequest {
                        idempotency_key: format!("prop-create-{n}"),
                        email: "ana@example.edu".into(),
                        first_name: "Ana".into(),
                        last_name: "Pérez".into(),
                        document_number: format!("DOC-U{n}"),
                        student_id: student_id.clone(),
                    })
                    .await
                    .map_err(|status| TestCaseError::fail(format!("create: {status:?}")))?;
                let mut request = UpdateUserRequest {
                    idempotency_key: format!("prop-update-{n}"),
                    student_id,
                    first_name: "Changed".into(),
                    last_name: "Name".into(),
                    email: "changed@example.edu".into(),
                    source_version: 2,
                    user_id: String::new(),
                };
                let slot = match field {
                    0 => &mut request.idempotency_key,
                    1 => &mut request.student_id,
                    2 => &mut request.first_name,
                    3 => &mut request.last_name,
                    _ => &mut request.email,
                };
                *slot = value.clone();
                let key = request.idempotency_key.clone();
                let before = users_and_inbox_rows(&app.users_db).await;
                let answer = app.users.clone().update_user(request).await;
                let after = users_and_inbox_rows(&app.users_db).await;
                match answer {
                    Ok(response) => {
                        prop_assert!(response.into_inner().applied);
                        prop_assert_eq!(after, (before.0, before.1 + 1), "one inbox row");
                        keys.lock().expect("lock").insert(key);
                    }
                    Err(status) if status.code() == Code::InvalidArgument => {
                        names_field(&status, UPDATE_USER_FIELDS[field])?;
                        prop_assert_eq!(after, before, "nothing stored");
                    }
                    // A well-formed student id with no user.
                    Err(status) if field == 1 && status.code() == Code::NotFound => {
                        prop_assert_eq!(after, before);
                    }
                    Err(status)
                        if field == 0
                            && status.code() == Code::FailedPrecondition
                            && keys.lock().expect("lock").contains(&key) =>
                    {
                        prop_assert_eq!(after, before);
                    }
                    Err(status) => prop_assert!(false, "unexpected answer {:?}", status),
                }
                Ok(())
            })
        },
    );
}

/// DeactivateStudent (`id`, `idempotency_key`) and DisableUser (`student_id`,
/// `idempotency_key`), each on a student or user of its own made for the case: a hostile
/// id is refused naming it, or is a well-formed id of nobody (NOT_FOUND); a hostile key is
/// refused naming it, or works, once (a key seen before came with another id).
fn deactivate_student_and_disable_user_fields_are_accepted_or_named(backend: Backend) {
    let keys = Arc::new(Mutex::new(HashSet::new()));
    run_property(backend, (0..4usize, hostile()), |app, (field, value), n| {
        let keys = keys.clone();
        Box::pin(async move {
            let spoil_id = field % 2 == 0;
            let (answer, named, key, stored) = if field < 2 {
                let student = case_student(app, n).await?;
                let request = DeactivateStudentRequest {
                    id: if spoil_id { value.clone() } else { student.id },
                    idempotency_key: Some(if spoil_id {
                        format!("prop-deactivate-{n}")
                    } else {
                        value.clone()
                    }),
                };
                let key = request.idempotency_key.clone().unwrap_or_default();
                let before = students_and_outbox_rows(&app.student_db).await;
                let answer = app.student.clone().deactivate_student(request).await;
                let after = students_and_outbox_rows(&app.student_db).await;
                let answer = answer.map(|student| !student.into_inner().active);
                let name = if spoil_id { "id" } else { "idempotency_key" };
                (answer, name, key, (after.0 - before.0, after.1 - before.1))
            } else {
                let student_id = uuid::Uuid::now_v7().to_string();
                app.users
                    .clone()
                    .create_user(CreateUserRequest {
                        idempotency_key: format!("prop-create-{n}"),
                        document_number: format!("DOC-D{n}"),
                        student_id: student_id.clone(),
                        ..valid_user(n)
                    })
                    .await
                    .map_err(|status| TestCaseError::fail(format!("create: {status:?}")))?;
                let request = DisableUserRequest {
                    idempotency_key: if spoil_id {
                        format!("prop-disable-{n}")
                    } else {
                        value.clone()
                    },
                    student_id: if spoil_id { value.clone() } else { student_id },
                    source_version: 2,
                    user_id: String::new(),
                };
                let key = request.idempotency_key.clone();
                let before = users_and_inbox_rows(&app.users_db).await;
                let answer = app.users.clone().disable_user(request).await;
                let after = users_and_inbox_rows(&app.users_db).await;
                let answer = answer.map(|disabled| disabled.into_inner().applied);
                let name = if spoil_id {
                    "student_id"
                } else {
                    "idempotency_key"
                };
                (answer, name, key, (after.0 - before.0, after.1 - before.1))
            };
            // A deactivation writes one outbox row; a disable one inbox row.
            let one_row = (0, 1);
            match answer {
                Ok(done) => {
                    prop_assert!(done, "deactivated or disabled");
                    prop_assert_eq!(stored, one_row);
                    // Accepted as the README's rule has it: 1–128 of [A-Za-z0-9._:-].
                    let key_rule = |c: char| c.is_ascii_alphanumeric() || "._:-".contains(c);
                    prop_assert!(
                        (1..=128).contains(&key.len()) && key.chars().all(key_rule),
                        "{:?}",
                        key
                    );
                    prop_assert!(
                        keys.lock().expect("lock").insert((field, key)),
                        "a key seen before would be another request"
                    );
                }
                Err(status) if status.code() == Code::InvalidArgument => {
                    names_field(&status, named)?;
                    prop_assert_eq!(stored, (0, 0), "nothing stored");
                }
                Err(status) if spoil_id && status.code() == Code::NotFound => {
                    prop_assert!(uuid::Uuid::try_parse(&value).is_ok(), "{:?}", value);
                    prop_assert_eq!(stored, (0, 0));
                }
                Err(status)
                    if !spoil_id
                        && status.code() == Code::FailedPrecondition
                        && keys.lock().expect("lock").contains(&(field, key.clone())) =>
                {
                    prop_assert_eq!(stored, (0, 0));
                }
                Err(status) => prop_assert!(false, "unexpected answer {:?}", status),
            }
            Ok(())
        })
    });
}

fn lookup_ids_and_page_tokens_are_accepted_or_named(backend: Backend) {
    run_property(
        backend,
        (0..5usize, hostile(), any::<i32>()),
        |app, (rpc, value, page_size), _| {
            Box::pin(async move {
                let is_uuid = value.len() == 36 && uuid::Uuid::try_parse(&value).is_ok();
                let (answer, field) = match rpc {
                    0 => (
                        app.student
                            .clone()
                            .get_student(GetStudentRequest { id: value.clone() })
                            .await
                            .map(drop),
                        "id",
                    ),
                    1 => (
                        app.users
                            .clone()
                            .get_user(GetUserRequest { id: value.clone() })
                            .await
                            .map(drop),
                        "id",
                    ),
                    3 => (
                        app.users
                            .clone()
                            .list_users(ListUsersRequest {
                                student_id: value.clone(),
                                ..ListUsersRequest::default()
                            })
                            .await
                            .map(drop),
                        "student_id",
                    ),
                    4 => {
                        let request = ListUsersRequest {
                            student_id: String::new(),
                            page_size,
                            page_token: value.clone(),
                        };
                        let answer = app.users.clone().list_users(request).await.map(drop);
                        let field = if page_size < 0 {
                            "page_size"
                        } else {
                            "page_token"
                        };
                        (answer, field)
                    }
                    _ => {
                        let request = ListStudentsRequest {
                            page_size,
                            page_token: value.clone(),
                        };
                        let answer = app.student.clone().list_students(request).await.map(drop);
                        let field = if page_size < 0 {
                            "page_size"
                        } else {
                            "page_token"
                        };
                        (answer, field)
                    }
                };
                match answer {
                    Ok(()) => prop_assert!(
                        ((rpc == 2 || rpc == 4) && page_size >= 0 && (value.is_empty() || is_uuid))
                            || (rpc == 3 && (value.is_empty() || is_uuid))
                    ),
                    Err(status) if status.code() == Code::NotFound => {
                        prop_assert!(rpc < 2 && is_uuid)
                    }
                    Err(status) => names_field(&status, field)?,
                }
                Ok(())
            })
        },
    );
}
