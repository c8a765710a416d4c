//! Who may call, over what, and what reaches the logs: token auth on Users, TLS on both
//! servers (certificates made per test), and no personal data in any log line.

use std::time::Duration;

use devstack::Process;
use proto::{
    student::v1::student_service_client::StudentServiceClient,
    users::v1::{
        CreateUserRequest, CreateUsersRequest, DisableUserRequest, GetUserRequest,
        ListUsersRequest, UpdateUserRequest, users_service_client::UsersServiceClient,
    },
};
use relay::{
    BatchOutcome, Relay,
    users_client::{UsersClient, UsersConnection},
};
use sea_orm::EntityTrait;
use student_store::entity::outbox::{self, FailureKind, OutboxStatus};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

use crate::{
    on_both_backends,
    support::{
        Backend, TestDatabases,
        app::{AppOptions, TestApp, bearer, channel, spawn_app_with, test_tuning},
        certs::TestPki,
        conflicting_user_request, eventually,
        invariants::{assert_each_student_linked_exactly_once, stored_user, users_and_inbox_rows},
        metrics::{sample, scrape},
        stack::{LINK_DEADLINE, RELAY_TUNING, Stack, binaries, exits_within_30_s},
        student_request,
    },
};

on_both_backends!(
    a_tls_relay_with_the_token_delivers_end_to_end,
    a_plaintext_client_is_refused_by_a_tls_server,
    a_relay_that_does_not_trust_the_ca_keeps_the_row_pending,
    a_relay_named_no_ca_file_trusts_the_systems_roots,
    calls_without_the_token_are_unauthenticated_while_health_and_reflection_stay_open,
    the_binaries_take_tls_and_the_token_from_their_environment,
    a_token_rotation_under_a_pending_backlog_fails_no_row,
    a_relay_on_a_refused_token_retries_then_exhausts_and_retry_failed_links_once_fixed,
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
    relay_over_with(app, ca_pem, token, test_tuning())
}

fn relay_over_with(
    app: &TestApp,
    ca_pem: &str,
    token: Option<&str>,
    config: relay::RunConfig,
) -> Relay {
    let connection = UsersConnection {
        url: format!("https://{}", app.users_addr),
        ca_pem: Some(ca_pem.as_bytes().to_vec()),
        auth_token: token.map(str::to_owned),
    };
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

/// README ("Configuration", `--users-ca`): a relay named no CA file trusts the system's
/// roots for an `https://` Users, and one named a CA file trusts that CA only. Relay
/// processes given their system roots by `SSL_CERT_FILE` (which the system-roots loader
/// reads, so the test does not depend on the machine's bundle): the first, named no CA
/// and whose roots are another CA, cannot verify Users and keeps the row pending
/// (retried: an attempt used); the second, named that other CA and whose roots are the
/// test CA, cannot either; the third, named no CA and whose roots are the test CA,
/// delivers it.
async fn a_relay_named_no_ca_file_trusts_the_systems_roots(backend: Backend) {
    let Some((app, pki)) = secured_app(backend).await else {
        return;
    };
    let (ca, _, _) = pki.write_to(app.databases.dir.path());
    app.student
        .clone()
        .create_student(student_request(1))
        .await
        .expect("created");
    let relay = |name: &str, extra: &[(&str, &str)]| {
        let env: Vec<(String, String)> = [
            ("STUDENT_DATABASE_URL", app.databases.student_url.as_str()),
            ("USERS_URL", &format!("https://{}", app.users_addr)),
            ("USERS_AUTH_TOKEN", TOKEN),
        ]
        .iter()
        .chain(extra)
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
        let args: Vec<String> = std::iter::once("run")
            .chain(RELAY_TUNING.iter().copied())
            .map(str::to_owned)
            .collect();
        let log = app.databases.dir.path().join(format!("{name}.log"));
        Process::spawn_isolated(&binaries().join("relay"), &args, &env, &log).expect("relay")
    };
    let strangers = app.databases.dir.path().join("strangers");
    std::fs::create_dir(&strangers).expect("a directory");
    let (stranger_ca, _, _) = TestPki::new().write_to(&strangers);
    let stranger_ca = stranger_ca.to_string_lossy();
    let mut untrusting = relay("relay-other-roots", &[("SSL_CERT_FILE", &stranger_ca)]);
    // Retried (a transient failure: pending again, with its attempt), never failed.
    let retried = eventually("the row retried", LINK_DEADLINE, || async {
        let row = only_row(&app).await;
        assert_ne!(row.status, OutboxStatus::Failed, "{row:?}");
        (row.status == OutboxStatus::Pending && row.attempts >= 1).then_some(row)
    })
    .await;
    untrusting.kill().expect("kill");
    assert!(retried.last_error.is_some(), "{retried:?}");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    // A relay named a CA file trusts that CA only, not the system's roots besides: its
    // file is the other CA and its system roots the test CA, and it cannot verify Users.
    let ca = ca.to_string_lossy();
    // Attempts from here on are this relay's (the first may have tried again before it
    // was killed).
    let before = only_row(&app).await;
    let mut named_other = relay(
        "relay-named-other-ca",
        &[("USERS_TLS_CA", &stranger_ca), ("SSL_CERT_FILE", &ca)],
    );
    eventually("the row retried again", LINK_DEADLINE, || async {
        let row = only_row(&app).await;
        assert_ne!(row.status, OutboxStatus::Done, "trusted the system's roots");
        (row.status == OutboxStatus::Pending && row.attempts > before.attempts).then_some(())
    })
    .await;
    named_other.kill().expect("kill");
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    let _trusting = relay("relay-test-roots", &[("SSL_CERT_FILE", &ca)]);
    eventually("the row delivered", LINK_DEADLINE, || async {
        (only_row(&app).await.status == OutboxStatus::Done).then_some(())
    })
    .await;
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

/// README ("Rotating the token"): a relay left on a refused token retries its row, each try
/// an attempt, and past `--max-attempts` the row fails as `exhausted`, never `rejected`
/// (which would keep its key from a plain redrive). `retry-failed --all` requeues it with
/// its key, and the relay with the right token links it.
async fn a_relay_on_a_refused_token_retries_then_exhausts_and_retry_failed_links_once_fixed(
    backend: Backend,
) {
    let Some((app, pki)) = secured_app(backend).await else {
        return;
    };
    app.student
        .clone()
        .create_student(student_request(1))
        .await
        .expect("created");
    let refused = relay_over_with(
        &app,
        &pki.ca_pem,
        Some("wrong-token-0123456789"),
        relay::RunConfig {
            max_attempts: 3,
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(1),
            ..test_tuning()
        },
    );
    let failed = eventually("three attempts used up", LINK_DEADLINE, || async {
        refused.deliver_batch().await.expect("batch");
        let row = only_row(&app).await;
        (row.status == OutboxStatus::Failed).then_some(row)
    })
    .await;
    assert_eq!(
        (
            failed.attempts,
            failed.failure_kind,
            failed.error_code.as_deref()
        ),
        (3, Some(FailureKind::Exhausted), Some("UNAUTHENTICATED"))
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    let fixed = relay_over(&app, &pki.ca_pem, Some(TOKEN));
    let mut out = Vec::new();
    let summary = relay::retry_failed::retry_failed(
        &app.student_db,
        &fixed.users,
        relay::retry_failed::Selection::All,
        relay::retry_failed::Keys::Keep,
        &mut out,
    )
    .await
    .expect("retry-failed");
    assert_eq!(
        (summary.exit_code(), String::from_utf8(out).expect("utf-8")),
        (
            0,
            format!(
                "id={} key={} requeued\nrequeued=1 linked=0 skipped=0 errors=0\n",
                failed.id, failed.idempotency_key
            )
        )
    );
    let outcome = fixed.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (1, 1), "{outcome:?}");
    let row = only_row(&app).await;
    assert_eq!(
        (row.status, row.idempotency_key),
        (OutboxStatus::Done, failed.idempotency_key),
        "linked under its own key"
    );
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

async fn calls_without_the_token_are_unauthenticated_while_health_and_reflection_stay_open(
    backend: Backend,
) {
    let Some((app, pki)) = secured_app(backend).await else {
        return;
    };
    // Every Users method, refused before anything reads the request (these are empty).
    let mut anonymous = UsersServiceClient::new(channel(app.users_addr, Some(&pki)));
    let refusals = [
        anonymous
            .create_user(CreateUserRequest::default())
            .await
            .err(),
        anonymous
            .create_users(CreateUsersRequest::default())
            .await
            .err(),
        anonymous.get_user(GetUserRequest::default()).await.err(),
        anonymous
            .list_users(ListUsersRequest::default())
            .await
            .err(),
        anonymous
            .update_user(UpdateUserRequest::default())
            .await
            .err(),
        anonymous
            .disable_user(DisableUserRequest::default())
            .await
            .err(),
    ];
    for status in refusals {
        let status = status.expect("no token: refused");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unauthenticated, "missing or invalid bearer token")
        );
    }

    // A relay with the wrong token: UNAUTHENTICATED says nothing about the operation (the
    // request never reached the inbox), so the row is retried, not failed.
    app.student
        .clone()
        .create_student(student_request(1))
        .await
        .expect("created");
    let outcome = relay_over(&app, &pki.ca_pem, Some("wrong-token-0123456789"))
        .deliver_batch()
        .await
        .expect("batch");
    assert_eq!((outcome.retried, outcome.failed), (1, 0));
    let row = only_row(&app).await;
    assert_eq!(
        (
            row.status,
            row.failure_kind,
            row.error_code.as_deref(),
            row.last_error.as_deref()
        ),
        (
            OutboxStatus::Pending,
            None,
            Some("UNAUTHENTICATED"),
            Some("missing or invalid bearer token")
        )
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    let health = HealthClient::new(channel(app.users_addr, Some(&pki)))
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health needs no token");
    assert_eq!(health.into_inner().status(), ServingStatus::Serving);

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let answer = ServerReflectionClient::new(channel(app.users_addr, Some(&pki)))
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection needs no token")
        .into_inner()
        .message()
        .await
        .expect("answer")
        .and_then(|answer| answer.message_response);
    let Some(MessageResponse::ListServicesResponse(list)) = answer else {
        panic!("unexpected reflection answer {answer:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|service| service.name == "users.v1.UsersService"),
        "{list:?}"
    );
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
    let short = exits_within_30_s(
        tokio::process::Command::new(binaries().join("users-svc"))
            .env_clear()
            .args(["--listen", "127.0.0.1:0", "--database-url", &dbs.users_url])
            .env("USERS_AUTH_TOKEN", "too-short"),
        "users-svc with a short token",
    )
    .await;
    assert!(!short.status.success());
    assert!(
        String::from_utf8_lossy(&short.stderr)
            .contains("every USERS_AUTH_TOKEN token must be at least 16 bytes long")
    );
    // Half a TLS pair is refused at start-up too, never served as plaintext.
    for (binary, url, variable, file) in [
        ("users-svc", &dbs.users_url, "USERS_TLS_CERT", &cert),
        ("users-svc", &dbs.users_url, "USERS_TLS_KEY", &key),
        ("student-svc", &dbs.student_url, "STUDENT_TLS_CERT", &cert),
        ("student-svc", &dbs.student_url, "STUDENT_TLS_KEY", &key),
    ] {
        let half = exits_within_30_s(
            tokio::process::Command::new(binaries().join(binary))
                .env_clear()
                .args(["--listen", "127.0.0.1:0", "--database-url", url])
                .env(variable, path(file)),
            &format!("{binary} with {variable} alone"),
        )
        .await;
        let stderr = String::from_utf8_lossy(&half.stderr);
        assert!(!half.status.success(), "{binary} with {variable} alone");
        assert!(
            stderr.contains("TLS needs both a certificate and a key"),
            "{binary} with {variable} alone: {stderr}"
        );
    }
    // A token in the environment is not shown by any binary's --help.
    for help in [
        &["users-svc", "--help"][..],
        &["student-svc", "--help"],
        &["relay", "--help"],
        &["relay", "run", "--help"],
    ] {
        let shown = std::process::Command::new(binaries().join(help[0]))
            .env_clear()
            .args(&help[1..])
            .env("USERS_AUTH_TOKEN", TOKEN)
            .output()
            .expect("--help");
        assert!(shown.status.success(), "{help:?}");
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(text.contains("USERS_AUTH_TOKEN"), "{help:?}: {text}");
        assert!(!text.contains(TOKEN), "{help:?} shows the token: {text}");
    }

    let mut users = Process::spawn_isolated(
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
    // student-svc on this test's Student DB, set up by its environment only.
    let start_student = |variables: &[(&str, String)], name: &str| {
        let mut process = Process::spawn_isolated(
            &binaries().join("student-svc"),
            &args(&[
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &dbs.student_url,
            ]),
            &env(variables),
            &log(name),
        )
        .expect("student-svc starts");
        let addr = process
            .listening_addr(Duration::from_secs(30))
            .expect("listens");
        (process, addr)
    };
    // The Users settings are read by `--link-mode direct` only: in the outbox mode a CA
    // file that cannot be read stops nothing.
    let (_student, student_addr) = start_student(
        &[
            ("STUDENT_TLS_CERT", path(&cert)),
            ("STUDENT_TLS_KEY", path(&key)),
            ("USERS_TLS_CA", "/nonexistent/users-ca.pem".into()),
        ],
        "student-svc",
    );
    let relay_env = env(&[
        ("STUDENT_DATABASE_URL", dbs.student_url.clone()),
        ("USERS_URL", format!("https://{users_addr}")),
        ("USERS_TLS_CA", path(&ca)),
        ("USERS_AUTH_TOKEN", TOKEN.into()),
    ]);
    let _relay = Process::spawn_isolated(
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
        .env_clear()
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

    // `relay retry-failed` asks Users over TLS with the token too: someone else holds
    // student 3's document number, so its row is rejected; without the token its
    // questions are refused (exit 2, nothing changed), with it the row gets a new key.
    UsersServiceClient::with_interceptor(
        channel(users_addr, Some(&pki)),
        bearer(Some(TOKEN.into())),
    )
    .create_user(conflicting_user_request(3))
    .await
    .expect("someone else holds student 3's document number");
    client
        .create_student(student_request(3))
        .await
        .expect("created");
    let failed = eventually("the row rejected", LINK_DEADLINE, || async {
        outbox::Entity::find()
            .all(&student_db)
            .await
            .expect("rows")
            .into_iter()
            .find(|row| row.status == OutboxStatus::Failed)
    })
    .await;
    let retry_failed = |env: &[(String, String)]| {
        std::process::Command::new(binaries().join("relay"))
            .env_clear()
            .args(["retry-failed", "--all", "--new-key"])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("relay retry-failed")
    };
    let without_token: Vec<(String, String)> = relay_env
        .iter()
        .filter(|(name, _)| name != "USERS_AUTH_TOKEN")
        .cloned()
        .collect();
    let refused = retry_failed(&without_token);
    let stdout = String::from_utf8_lossy(&refused.stdout);
    assert_eq!(refused.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains(&format!("id={} ", failed.id)) && stdout.contains("not re-keyed"),
        "{stdout}"
    );
    let rekeyed = retry_failed(&relay_env);
    let stdout = String::from_utf8_lossy(&rekeyed.stdout);
    assert_eq!(rekeyed.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "requeued (new key; was {}): Users holds no user of student {}",
            failed.idempotency_key, failed.aggregate_id
        )),
        "{stdout}"
    );

    // The naive flow takes the same settings from the same variables (README,
    // configuration: read by `--link-mode direct` only): its CreateStudent calls Users
    // itself, over TLS with the token, and the user it creates names that student.
    let (_direct, direct_addr) = start_student(
        &[
            ("STUDENT_LINK_MODE", "direct".into()),
            ("USERS_URL", format!("https://{users_addr}")),
            ("USERS_TLS_CA", path(&ca)),
            ("USERS_AUTH_TOKEN", TOKEN.into()),
        ],
        "student-svc-direct",
    );
    let created = StudentServiceClient::new(channel(direct_addr, None))
        .create_student(student_request(2))
        .await
        .expect("created through Users")
        .into_inner();
    let user_id: uuid::Uuid = created.user_id.parse().expect("linked at once");
    let user = stored_user(&users_db, user_id).await;
    assert_eq!(user.student_id.to_string(), created.id);

    // The token reached no log and no command's output; Users says how many it accepts.
    let users_log = std::fs::read_to_string(log("users-svc")).expect("users-svc's log");
    assert!(
        users_log.contains("users-svc listening") && users_log.contains("tokens=1"),
        "{users_log}"
    );
    for name in ["users-svc", "student-svc", "student-svc-direct", "relay"] {
        let text = std::fs::read_to_string(log(name)).expect("a log");
        assert!(!text.contains(TOKEN), "{name}'s log shows the token");
    }
    for output in [&replay, &refused, &rekeyed] {
        for text in [&output.stdout, &output.stderr] {
            assert!(!String::from_utf8_lossy(text).contains(TOKEN));
        }
    }
}

const OLD_TOKEN: &str = "old-token-0123456789abcdef";
const NEW_TOKEN: &str = "new-token-fedcba9876543210";

async fn a_token_rotation_under_a_pending_backlog_fails_no_row(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let relay_token = |token: &'static str| ["--users-auth-token", token];

    // Users accepts the old token; a relay with it delivers.
    stack.kill_relays();
    stack
        .restart_users_with(None, &["--auth-token", OLD_TOKEN])
        .await;
    stack.start_relay(None, &relay_token(OLD_TOKEN));
    stack.create_students(0..3).await;
    stack.wait_until_all_linked(3).await;

    // A backlog builds while no relay runs; the rotation starts: Users accepts both.
    stack.kill_relays();
    stack.create_students(3..8).await;
    let both = format!("{OLD_TOKEN},{NEW_TOKEN}");
    stack
        .restart_users_with(None, &["--auth-token", &both])
        .await;
    // A relay on the new token and one still on the old one both deliver.
    stack.start_relay(None, &relay_token(NEW_TOKEN));
    stack.start_relay(None, &relay_token(OLD_TOKEN));
    stack.wait_until_all_linked(8).await;

    // The rotation ends: the old token is dropped, and a relay left on it (a typo, a
    // forgotten host) is refused. Its rows wait and retry; none fails.
    stack.kill_relays();
    stack
        .restart_users_with(
            None,
            &["--auth-token", NEW_TOKEN, "--metrics-addr", "127.0.0.1:0"],
        )
        .await;
    stack.start_relay(None, &relay_token(OLD_TOKEN));
    stack.create_students(8..12).await;
    // The rows of students 8..12 are the last four.
    eventually(
        "every new row refused three times",
        LINK_DEADLINE,
        || async {
            let rows = stack.outbox_rows().await;
            rows.iter()
                .skip(8)
                .all(|row| row.attempts >= 3)
                .then_some(())
        },
    )
    .await;
    // Stopped (it records what it has in flight), the relay leaves every row waiting to be
    // retried, none failed.
    stack.stop_relays(Duration::from_secs(15));
    for row in stack.outbox_rows().await.iter().skip(8) {
        assert_eq!(
            (row.status, row.failure_kind),
            (OutboxStatus::Pending, None),
            "refused by the token, not failed: {row:?}"
        );
    }
    let status = stack.relay_command(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.starts_with("pending 4\nprocessing 0\ndone 8\nfailed 0\n"),
        "{status}"
    );
    assert!(status.ends_with("retrying 4\nblocked 0\n"), "{status}");
    stack.wait_for_relay_log_lines("UNAUTHENTICATED", 1).await;
    // Users counts each refusal under the reason `UsersRefusingToken` watches: one per
    // call it answered UNAUTHENTICATED (a call may carry several rows), three at least.
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    let refused_calls: f64 = ["CreateUser", "CreateUsers"]
        .iter()
        .map(|method| {
            let labels = [
                ("grpc_service", "users.v1.UsersService"),
                ("grpc_method", method),
                ("grpc_code", "UNAUTHENTICATED"),
            ];
            sample(&users, "grpc_server_handled_total", &labels)
        })
        .sum();
    let rejected = sample(
        &users,
        "users_rejected_total",
        &[("reason", "UNAUTHENTICATED")],
    );
    assert!(rejected >= 3.0, "{users}");
    assert_eq!(rejected, refused_calls, "{users}");

    // Fixing the relay's token delivers them.
    stack.start_relay(None, &relay_token(NEW_TOKEN));
    stack.wait_until_all_linked(12).await;
    stack.stop_relays(Duration::from_secs(15));
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 12).await;
}

/// Values no log line may contain in clear.
const CANARY_EMAIL: &str = "pii.canary.7@example.edu";
const CANARY_DOCUMENT: &str = "PIICANARY77";
const OTHER_CANARY_EMAIL: &str = "other.canary.8@example.edu";
const OTHER_CANARY_DOCUMENT: &str = "PIICANARY88";
const CHANGED_CANARY_EMAIL: &str = "changed.canary.9@example.edu";
/// The start of the e-mails (`<this>.<n>@example.edu`) and document numbers (`<this><n>`)
/// of the students whose rows reach Users together.
const BATCH_CANARY: &str = "batch.canary";
const BATCH_CANARY_DOCUMENT: &str = "PIIBATCH";

/// A log filter with every crate of the workspace at `trace` (read from the workspace's
/// `members`, so a crate added later is covered too) and everything else at `info`.
fn every_project_crate_at_trace() -> String {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
        .expect("read the workspace's Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("members = ["))
        .and_then(|rest| rest.strip_suffix(']'))
        .expect("the workspace lists its members on one line");
    let mut directives: Vec<String> = members
        .split(',')
        .map(|name| format!("{}=trace", name.trim().trim_matches('"').replace('-', "_")))
        .collect();
    assert!(
        directives
            .iter()
            .any(|directive| directive == "student_store=trace"),
        "{directives:?}"
    );
    directives.push("info".into());
    directives.join(",")
}

async fn no_email_or_document_number_reaches_any_log(backend: Backend) {
    let trace = every_project_crate_at_trace();
    let Some(mut stack) = Stack::start_logging(backend, &trace).await else {
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
    // Users' rejection path: another key asks for a user with the canary document number.
    let mut users = stack.users_client();
    let taken = users
        .create_user(proto::users::v1::CreateUserRequest {
            idempotency_key: "canary-twin".into(),
            email: CANARY_EMAIL.into(),
            first_name: "Twin".into(),
            last_name: "Canary".into(),
            document_number: CANARY_DOCUMENT.into(),
            student_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("taken");
    assert_eq!(taken.code(), Code::AlreadyExists);
    // The relay's rejection path and its redrive: a student whose number Users already
    // gave to someone else.
    users
        .create_user(proto::users::v1::CreateUserRequest {
            idempotency_key: "canary-holder".into(),
            email: OTHER_CANARY_EMAIL.into(),
            first_name: "Holder".into(),
            last_name: "Canary".into(),
            document_number: OTHER_CANARY_DOCUMENT.into(),
            student_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect("created");
    client
        .create_student(proto::student::v1::CreateStudentRequest {
            email: OTHER_CANARY_EMAIL.into(),
            document_number: OTHER_CANARY_DOCUMENT.into(),
            ..student_request(10)
        })
        .await
        .expect("created");
    eventually("the second canary's row to fail", LINK_DEADLINE, || async {
        let rows = stack.outbox_rows().await;
        (rows.len() == 2 && rows[1].status == OutboxStatus::Failed).then_some(())
    })
    .await;

    let mut cli_output = String::new();
    for args in [
        &["replay", "--all"][..],
        &["status"],
        &["retry-failed", "--all"],
        &["retry-failed", "--all", "--new-key"],
        &["show", "--student", &id],
        &["audit"],
    ] {
        let output = stack.relay_command(args);
        assert!(
            output.status.code().is_some_and(|code| code <= 1),
            "relay {args:?}: {output:?}"
        );
        cli_output.push_str(&String::from_utf8_lossy(&output.stdout));
        cli_output.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    // The re-keyed row is refused again: settled before anything else is sent.
    eventually("the re-keyed row to fail again", LINK_DEADLINE, || async {
        let rows = stack.outbox_rows().await;
        rows.iter()
            .all(|row| matches!(row.status, OutboxStatus::Done | OutboxStatus::Failed))
            .then_some(())
    })
    .await;
    // The change path: the linked canary student moves to a third canary e-mail.
    client
        .update_student(proto::student::v1::UpdateStudentRequest {
            id: id.clone(),
            first_name: "Changed".into(),
            last_name: "Canary".into(),
            email: CHANGED_CANARY_EMAIL.into(),
            expected_version: 0,
            idempotency_key: None,
        })
        .await
        .expect("updated");
    let done = |rows: Vec<outbox::Model>| {
        rows.iter()
            .filter(|row| row.status == OutboxStatus::Done)
            .count()
    };
    eventually("the change to reach Users", LINK_DEADLINE, || async {
        (done(stack.outbox_rows().await) == 2).then_some(())
    })
    .await;
    // The batched path: two canary students created while no relay runs reach Users
    // together, in one CreateUsers call.
    stack.kill_relays();
    for n in 0..2 {
        client
            .create_student(proto::student::v1::CreateStudentRequest {
                email: format!("{BATCH_CANARY}.{n}@example.edu"),
                document_number: format!("{BATCH_CANARY_DOCUMENT}{n}"),
                ..student_request(11 + n)
            })
            .await
            .expect("created");
    }
    stack.start_relay_sending_together();
    eventually("both batched rows to be linked", LINK_DEADLINE, || async {
        (done(stack.outbox_rows().await) == 4).then_some(())
    })
    .await;
    let _ = client
        .get_student(proto::student::v1::GetStudentRequest { id })
        .await
        .expect("found");
    // Every process has ended, so every line it wrote is in its log file.
    stack.terminate_all(Duration::from_secs(15));

    let logs = stack.all_logs() + &cli_output;
    // The filter took: a filter that does not parse falls back to `info`, and would leave
    // every level below it unlooked at.
    assert!(
        logs.lines()
            .any(|line| line.contains(" DEBUG ") || line.contains(" TRACE ")),
        "the crates logged below info"
    );
    assert!(
        logs.contains("p***@example.edu") && logs.contains("***77"),
        "the masked values were logged (and captured)"
    );
    assert!(
        cli_output.contains("rejected") || cli_output.contains("requeued"),
        "the CLI's output was captured: {cli_output}"
    );
    assert!(
        logs.lines()
            .any(|line| line.contains("user created") && line.contains("batch=2")),
        "the batched rows were logged by CreateUsers"
    );
    assert!(
        logs.lines().any(|line| line.contains("user updated")),
        "the change was logged by Users"
    );
    for secret in [
        CANARY_EMAIL,
        "pii.canary",
        CANARY_DOCUMENT,
        OTHER_CANARY_EMAIL,
        OTHER_CANARY_DOCUMENT,
        CHANGED_CANARY_EMAIL,
        BATCH_CANARY,
        BATCH_CANARY_DOCUMENT,
    ] {
        let leaks: Vec<&str> = logs.lines().filter(|line| line.contains(secret)).collect();
        assert!(
            leaks.is_empty(),
            "{secret} leaked in {} lines, first: {:?}",
            leaks.len(),
            leaks.first()
        );
    }
}
