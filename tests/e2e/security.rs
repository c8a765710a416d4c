//! Who may call, over what, and what reaches the logs: token auth on Users, TLS on both
//! servers (certificates made per test), and no personal data in any log line.

use std::time::Duration;

use devstack::Process;
use proto::{
    student::v1::student_service_client::StudentServiceClient,
    users::v1::users_service_client::UsersServiceClient,
};
use relay::{
    BatchOutcome, Relay,
    users_client::{UsersClient, UsersConnection},
};
use sea_orm::EntityTrait;
use student_svc::entity::outbox::{self, OutboxStatus};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    on_both_backends,
    support::{
        Backend, TestDatabases,
        app::{AppOptions, TestApp, channel, spawn_app_with, test_tuning},
        certs::TestPki,
        eventually,
        invariants::{assert_each_student_linked_exactly_once, users_and_inbox_rows},
        stack::{Stack, binaries},
        student_request,
    },
};

on_both_backends!(
    a_tls_relay_with_the_token_delivers_end_to_end,
    a_plaintext_client_is_refused_by_a_tls_server,
    a_relay_that_does_not_trust_the_ca_keeps_the_row_pending,
    calls_without_the_token_are_unauthenticated_while_health_stays_open,
    the_binaries_take_tls_and_the_token_from_their_environment,
    no_email_or_document_number_reaches_any_log,
);

const TOKEN: &str = "test-token-0123456789abcdef";

async fn secured_app(backend: Backend) -> Option<(TestApp, TestPki)> {
    let pki = TestPki::new();
    let options = AppOptions {
        tls: Some(pki.clone()),
        users_token: Some(TOKEN.into()),
        ..AppOptions::default()
    };
    Some((spawn_app_with(backend, options).await?, pki))
}

fn relay_over(app: &TestApp, ca_pem: &str, token: Option<&str>) -> Relay {
    let connection = UsersConnection {
        url: format!("https://{}", app.users_addr),
        ca_pem: Some(ca_pem.as_bytes().to_vec()),
        auth_token: token.map(str::to_owned),
    };
    let config = test_tuning();
    let users = UsersClient::connect(&connection, config.call_timeout).expect("users client");
    Relay::new(app.student_db.clone(), users, config)
}

async fn only_row(app: &TestApp) -> outbox::Model {
    outbox::Entity::find()
        .one(&app.student_db)
        .await
        .expect("query")
        .expect("one row")
}

async fn a_tls_relay_with_the_token_delivers_end_to_end(backend: Backend) {
    let Some((app, pki)) = secured_app(backend).await else {
        return;
    };
    app.student
        .clone()
        .create_student(student_request(1))
        .await
        .expect("created over TLS");
    let outcome = relay_over(&app, &pki.ca_pem, Some(TOKEN))
        .deliver_batch()
        .await
        .expect("batch");
    assert_eq!(outcome.delivered, 1, "{outcome:?}");
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

async fn a_plaintext_client_is_refused_by_a_tls_server(backend: Backend) {
    let Some((app, _pki)) = secured_app(backend).await else {
        return;
    };
    for addr in [app.users_addr, app.student_addr] {
        let mut plaintext = StudentServiceClient::new(channel(addr, None));
        let status = plaintext
            .create_student(student_request(1))
            .await
            .expect_err("refused");
        // Refused at the transport: the connection closes before any service sees a call.
        assert!(
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
            ),
            "{status:?}"
        );
    }
    let mut plaintext = UsersServiceClient::new(channel(app.users_addr, None));
    let status = plaintext
        .get_user(proto::users::v1::GetUserRequest {
            id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("refused");
    assert_ne!(
        status.code(),
        Code::NotFound,
        "the request never reached the service"
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

async fn a_relay_that_does_not_trust_the_ca_keeps_the_row_pending(backend: Backend) {
    let Some((app, _pki)) = secured_app(backend).await else {
        return;
    };
    app.student
        .clone()
        .create_student(student_request(1))
        .await
        .expect("created");
    let stranger = TestPki::new();
    let outcome = relay_over(&app, &stranger.ca_pem, Some(TOKEN))
        .deliver_batch()
        .await
        .expect("batch");
    assert_eq!(
        outcome,
        BatchOutcome {
            claimed: 1,
            retried: 1,
            ..BatchOutcome::default()
        }
    );
    let row = only_row(&app).await;
    assert_eq!(
        (row.status, row.attempts),
        (OutboxStatus::Pending, 1),
        "transient, not failed"
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

async fn calls_without_the_token_are_unauthenticated_while_health_stays_open(backend: Backend) {
    let Some((app, pki)) = secured_app(backend).await else {
        return;
    };
    let mut anonymous = UsersServiceClient::new(channel(app.users_addr, Some(&pki)));
    let status = anonymous
        .get_user(proto::users::v1::GetUserRequest {
            id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("no token");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unauthenticated, "missing or invalid bearer token")
    );

    // A relay with the wrong token: UNAUTHENTICATED is permanent, the row fails visibly.
    app.student
        .clone()
        .create_student(student_request(1))
        .await
        .expect("created");
    let outcome = relay_over(&app, &pki.ca_pem, Some("wrong-token-0123456789"))
        .deliver_batch()
        .await
        .expect("batch");
    assert_eq!(outcome.failed, 1);
    assert_eq!(
        only_row(&app).await.last_error.as_deref(),
        Some("UNAUTHENTICATED: missing or invalid bearer token")
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    let health = HealthClient::new(channel(app.users_addr, Some(&pki)))
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health needs no token");
    assert_eq!(health.into_inner().status(), ServingStatus::Serving);
}

async fn the_binaries_take_tls_and_the_token_from_their_environment(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let pki = TestPki::new();
    let (ca, cert, key) = pki.write_to(dbs.dir.path());
    let path = |p: &std::path::Path| p.display().to_string();
    let log = |name: &str| dbs.dir.path().join(format!("{name}.log"));
    let env = |pairs: &[(&str, String)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect::<Vec<_>>()
    };
    let args = |pairs: &[&str]| pairs.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();

    // A token shorter than 16 bytes is refused at start-up, saying why.
    let short = std::process::Command::new(binaries().join("users-svc"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &dbs.users_url])
        .env("USERS_AUTH_TOKEN", "too-short")
        .output()
        .expect("run users-svc");
    assert!(!short.status.success());
    assert!(
        String::from_utf8_lossy(&short.stderr)
            .contains("USERS_AUTH_TOKEN must be at least 16 bytes long")
    );

    let mut users = Process::spawn(
        &binaries().join("users-svc"),
        &args(&["--listen", "127.0.0.1:0", "--database-url", &dbs.users_url]),
        &env(&[
            ("USERS_TLS_CERT", path(&cert)),
            ("USERS_TLS_KEY", path(&key)),
            ("USERS_AUTH_TOKEN", TOKEN.into()),
        ]),
        &log("users-svc"),
    )
    .expect("users-svc");
    let users_addr = users
        .listening_addr(Duration::from_secs(30))
        .expect("listens");
    let mut student = Process::spawn(
        &binaries().join("student-svc"),
        &args(&[
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &dbs.student_url,
        ]),
        &env(&[
            ("STUDENT_TLS_CERT", path(&cert)),
            ("STUDENT_TLS_KEY", path(&key)),
        ]),
        &log("student-svc"),
    )
    .expect("student-svc");
    let student_addr = student
        .listening_addr(Duration::from_secs(30))
        .expect("listens");
    let relay_env = env(&[
        ("STUDENT_DATABASE_URL", dbs.student_url.clone()),
        ("USERS_URL", format!("https://{users_addr}")),
        ("USERS_TLS_CA", path(&ca)),
        ("USERS_AUTH_TOKEN", TOKEN.into()),
    ]);
    let _relay = Process::spawn(
        &binaries().join("relay"),
        &args(&["run", "--poll-interval", "50ms"]),
        &relay_env,
        &log("relay"),
    )
    .expect("relay");

    let mut client = StudentServiceClient::new(channel(student_addr, Some(&pki)));
    eventually(
        "student-svc to accept TLS calls",
        Duration::from_secs(30),
        || {
            let mut client = client.clone();
            async move {
                client
                    .list_students(proto::student::v1::ListStudentsRequest::default())
                    .await
                    .ok()
            }
        },
    )
    .await;
    let id = client
        .create_student(student_request(1))
        .await
        .expect("created")
        .into_inner()
        .id;
    let linked = eventually(
        "the student linked through TLS + token",
        Duration::from_secs(60),
        || {
            let (mut client, id) = (client.clone(), id.clone());
            async move {
                let student = client
                    .get_student(proto::student::v1::GetStudentRequest { id })
                    .await
                    .ok()?
                    .into_inner();
                (!student.user_id.is_empty()).then_some(student.user_id)
            }
        },
    )
    .await;

    let replay = std::process::Command::new(binaries().join("relay"))
        .args(["replay", "--all"])
        .envs(relay_env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("relay replay");
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!("user={linked} from_inbox=true matches_link=true")),
        "{stdout}"
    );
    let student_db = platform::db::connect(&dbs.student_url)
        .await
        .expect("Student DB");
    let users_db = platform::db::connect(&dbs.users_url)
        .await
        .expect("Users DB");
    assert_each_student_linked_exactly_once(&student_db, &users_db, 1).await;
}

/// Values no log line may contain in clear.
const CANARY_EMAIL: &str = "pii.canary.7@example.edu";
const CANARY_DOCUMENT: &str = "PIICANARY77";

async fn no_email_or_document_number_reaches_any_log(backend: Backend) {
    let trace =
        "student_svc=trace,users_svc=trace,relay=trace,platform=trace,migrations=trace,info";
    let Some(mut stack) = Stack::start_logging(backend, trace).await else {
        return;
    };
    let mut client = stack.student_client();
    let request = || proto::student::v1::CreateStudentRequest {
        email: CANARY_EMAIL.into(),
        document_number: CANARY_DOCUMENT.into(),
        idempotency_key: Some("canary".into()),
        ..student_request(7)
    };
    let id = client
        .create_student(request())
        .await
        .expect("created")
        .into_inner()
        .id;
    client.create_student(request()).await.expect("retried");
    // Rejections and bad input must not echo the values either.
    let twin = proto::student::v1::CreateStudentRequest {
        document_number: CANARY_DOCUMENT.into(),
        ..student_request(8)
    };
    assert_eq!(
        client.create_student(twin).await.expect_err("taken").code(),
        Code::AlreadyExists
    );
    let bad = proto::student::v1::CreateStudentRequest {
        email: format!("{CANARY_EMAIL} "),
        ..student_request(9)
    };
    assert_eq!(
        client.create_student(bad).await.expect_err("bad").code(),
        Code::InvalidArgument
    );
    stack.wait_until_all_linked(1).await;
    assert_eq!(
        stack.relay_command(&["replay", "--all"]).status.code(),
        Some(0)
    );
    assert_eq!(stack.relay_command(&["status"]).status.code(), Some(0));
    let _ = client
        .get_student(proto::student::v1::GetStudentRequest { id })
        .await
        .expect("found");
    stack.terminate_all(Duration::from_secs(15));

    let logs = stack.all_logs();
    assert!(
        logs.contains("p***@example.edu") && logs.contains("***77"),
        "the masked values were logged (and captured)"
    );
    for secret in [CANARY_EMAIL, "pii.canary", CANARY_DOCUMENT] {
        let leaks: Vec<&str> = logs.lines().filter(|line| line.contains(secret)).collect();
        assert!(
            leaks.is_empty(),
            "{secret} leaked in {} log lines, first: {:?}",
            leaks.len(),
            leaks.first()
        );
    }
}
