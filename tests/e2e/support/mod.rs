//! Test harness: fresh databases, in-process servers, real processes, and the invariants
//! every scenario ends by checking.

pub mod app;
pub mod certs;
pub mod collector;
pub mod commit_trap;
pub mod databases;
pub mod invariants;
pub mod metrics;
pub mod pgbench;
pub mod proxy;
pub mod scripted_users;
pub mod stack;
pub mod stalling_proxy;

use std::{future::Future, time::Duration};

pub use app::{TestApp, spawn_app};
pub use databases::{Backend, TestDatabases};
use proto::{student::v1::CreateStudentRequest, users::v1::CreateUserRequest};

/// Declares a test per backend for each listed scenario `async fn NAME(backend: Backend)`:
/// `NAME::sqlite` and `NAME::postgres`.
#[macro_export]
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$scenario($crate::support::Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$scenario($crate::support::Backend::Postgres).await
            }
        }
    )*};
}

/// Polls `check` every 50 ms until it returns `Some`, or fails the test after `timeout`
/// saying what was awaited. This replaces every sleep: a test waits for a condition.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An address that refuses connections for as long as the returned socket lives: bound,
/// never listening. (A port bound and then freed could be taken by another test's server.)
pub fn refusing_addr() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("address"))
        .expect("bind");
    let addr = socket.local_addr().expect("address");
    (socket, addr)
}

/// Asserts `status` is the refusal of a key sent again with another request, as both
/// services word it.
pub fn assert_key_reused(status: &tonic::Status) {
    assert_eq!(
        (status.code(), status.message()),
        (
            tonic::Code::FailedPrecondition,
            "idempotency_key was already used with a different request"
        ),
        "{status:?}"
    );
}

/// A valid CreateStudent request, distinct for each `n`.
pub fn student_request(n: usize) -> CreateStudentRequest {
    CreateStudentRequest {
        first_name: format!("Ana{n}"),
        last_name: "Pérez".to_owned(),
        email: format!("ana.perez.{n}@example.edu"),
        document_number: format!("DOC-{n:05}"),
        idempotency_key: None,
    }
}

/// A CreateUser for somebody else who already holds student `n`'s document number: sent
/// to Users directly, it makes the relay's delivery for student `n` a domain conflict.
pub fn conflicting_user_request(n: usize) -> CreateUserRequest {
    CreateUserRequest {
        idempotency_key: format!("someone-else-{n}"),
        email: "other@example.edu".to_owned(),
        first_name: "Other".to_owned(),
        last_name: "Person".to_owned(),
        document_number: student_request(n).document_number,
        student_id: uuid::Uuid::now_v7().to_string(),
    }
}

/// What `relay audit` says of an enabled user whose student the Student DB does not have,
/// as a [`conflicting_user_request`]'s user is: the one that holds the number.
pub fn user_of_no_student(user_id: &str, student_id: &str) -> String {
    format!(
        "user {user_id}: Users holds it, enabled, for student {student_id}, which the Student \
         DB does not have"
    )
}

/// Writes one user per id straight to the Users DB, `enabled` or not, each of a student of
/// its own that no Student DB has.
pub async fn insert_users_of_no_student(
    db: &sea_orm::DatabaseConnection,
    ids: impl IntoIterator<Item = uuid::Uuid>,
    enabled: bool,
) {
    use sea_orm::EntityTrait as _;
    use users_svc::entity::users;
    let at = chrono::Utc::now();
    let rows: Vec<users::ActiveModel> = ids
        .into_iter()
        .enumerate()
        .map(|(n, id)| {
            users::Model {
                id,
                email: format!("filler.{n}@example.edu"),
                first_name: "Filler".into(),
                last_name: format!("User {n}"),
                document_number: format!("FILL-{n}"),
                student_id: uuid::Uuid::now_v7(),
                enabled,
                created_at: at,
                source_version: 1,
            }
            .into()
        })
        .collect();
    users::Entity::insert_many(rows)
        .exec(db)
        .await
        .expect("insert users");
}

/// Writes `count` students straight to the Student DB, the first created at `first` and
/// each a millisecond after the one before (their UUIDv7 ids in the same order); none
/// linked, none with an outbox row: nothing a relay or an audit has to do with them.
pub async fn insert_unlinked_students(
    db: &sea_orm::DatabaseConnection,
    count: usize,
    first: chrono::DateTime<chrono::Utc>,
) {
    use sea_orm::EntityTrait as _;
    use student_store::entity::students;
    let rows: Vec<students::ActiveModel> = (0..count)
        .map(|n| {
            let at = first + chrono::TimeDelta::milliseconds(n as i64);
            let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
                uuid::NoContext,
                at.timestamp() as u64,
                at.timestamp_subsec_nanos(),
            ));
            students::Model {
                id,
                first_name: "Filler".into(),
                last_name: format!("Student {n}"),
                email: format!("filler.{n}@example.edu"),
                document_number: format!("FILL-{n}"),
                user_id: None,
                client_key: None,
                request_hash: String::new(),
                created_at: at,
                updated_at: at,
                version: 1,
                synced_version: 0,
                active: true,
            }
            .into()
        })
        .collect();
    for chunk in rows.chunks(100) {
        students::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(db)
            .await
            .expect("students");
    }
}

/// `statement` behind `explain` (`EXPLAIN …` of its backend), with its values.
pub fn explained(explain: &str, statement: sea_orm::Statement) -> sea_orm::Statement {
    sea_orm::Statement::from_sql_and_values(
        statement.db_backend,
        format!("{explain} {}", statement.sql),
        statement.values.map(|values| values.0).unwrap_or_default(),
    )
}
