//! Day two, against the three real binaries: the metrics each exports move with the work
//! done, and the alert rules and dashboard in `ops/` name only metrics that exist.

use std::collections::BTreeSet;

use proto::{student::v1::CreateStudentRequest, users::v1::CreateUserRequest};
use tonic::Code;

use crate::{
    on_both_backends,
    support::{
        Backend, conflicting_user_request, eventually,
        metrics::{exported_names, label_names, ops_expressions, promql_names, sample, scrape},
        stack::{LINK_DEADLINE, Stack},
        student_request,
    },
};

on_both_backends!(metrics_of_each_process_move_as_work_is_done);

async fn metrics_of_each_process_move_as_work_is_done(backend: Backend) {
    let Some(mut stack) = Stack::start_with_metrics(backend).await else {
        return;
    };
    let student_metrics = stack.metrics_addr("student-svc").await;
    let users_metrics = stack.metrics_addr("users-svc").await;
    let relay_metrics = stack.metrics_addr("relay-0").await;

    stack.create_students(0..3).await;
    let invalid = stack
        .student_client()
        .create_student(CreateStudentRequest {
            email: "not-an-email".into(),
            ..student_request(9)
        })
        .await
        .expect_err("an invalid e-mail is refused");
    assert_eq!(invalid.code(), Code::InvalidArgument);
    stack.wait_until_all_linked(3).await;

    // student-svc: every call counted by service, method and code.
    let student = scrape(student_metrics).await;
    let create_student = |code| {
        [
            ("grpc_service", "student.v1.StudentService"),
            ("grpc_method", "CreateStudent"),
            ("grpc_code", code),
        ]
    };
    assert_eq!(
        sample(&student, "grpc_server_handled_total", &create_student("OK")),
        3.0,
        "{student}"
    );
    assert_eq!(
        sample(
            &student,
            "grpc_server_handled_total",
            &create_student("INVALID_ARGUMENT")
        ),
        1.0,
        "{student}"
    );
    assert_eq!(
        sample(
            &student,
            "grpc_server_handling_seconds_count",
            &create_student("OK")[..2]
        ),
        4.0,
        "{student}"
    );

    // users-svc: three users executed through the inbox.
    let users = scrape(users_metrics).await;
    let create_user = [
        ("grpc_service", "users.v1.UsersService"),
        ("grpc_method", "CreateUser"),
        ("grpc_code", "OK"),
    ];
    assert_eq!(
        sample(&users, "grpc_server_handled_total", &create_user),
        3.0,
        "{users}"
    );
    let inbox = |result| [("rpc", "CreateUser"), ("result", result)];
    assert_eq!(
        sample(&users, "inbox_requests_total", &inbox("executed")),
        3.0,
        "{users}"
    );
    assert_eq!(
        sample(&users, "inbox_requests_total", &inbox("replayed")),
        0.0,
        "{users}"
    );

    // relay: three rows linked, each call to Users and each row's latency observed, and the
    // gauges (read from the database every few seconds) show them done.
    let relay = scrape(relay_metrics).await;
    let deliveries = |outcome| [("effect", "create-user"), ("outcome", outcome)];
    assert_eq!(
        sample(&relay, "relay_deliveries_total", &deliveries("linked")),
        3.0,
        "{relay}"
    );
    assert_eq!(
        sample(&relay, "relay_users_call_seconds_count", &[]),
        3.0,
        "{relay}"
    );
    assert_eq!(
        sample(&relay, "outbox_link_latency_seconds_count", &[]),
        3.0,
        "{relay}"
    );
    eventually(
        "the outbox gauges show three done rows",
        LINK_DEADLINE,
        || async {
            let relay = scrape(relay_metrics).await;
            let rows = |status| sample(&relay, "outbox_rows", &[("status", status)]);
            (rows("done") == 3.0 && rows("pending") == 0.0 && rows("processing") == 0.0)
                .then_some(())
        },
    )
    .await;
    let relay = scrape(relay_metrics).await;
    assert_eq!(sample(&relay, "outbox_rows", &[("status", "failed")]), 0.0);
    assert_eq!(
        sample(&relay, "outbox_oldest_pending_age_seconds", &[]),
        0.0
    );

    // A replay is answered from the inbox, and counted so.
    let replay = stack.relay_command(&["replay", "--all"]);
    assert_eq!(replay.status.code(), Some(0));
    let users = scrape(users_metrics).await;
    assert_eq!(
        sample(&users, "inbox_requests_total", &inbox("replayed")),
        3.0,
        "{users}"
    );
    assert_eq!(
        sample(&users, "inbox_requests_total", &inbox("executed")),
        3.0,
        "{users}"
    );

    // Users counts what it refuses, by reason.
    let refused = stack
        .users_client()
        .create_user(CreateUserRequest {
            email: "not-an-email".into(),
            ..conflicting_user_request(102)
        })
        .await
        .expect_err("an invalid e-mail is refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    let users = scrape(users_metrics).await;
    let rejected = |reason| sample(&users, "users_rejected_total", &[("reason", reason)]);
    assert_eq!(rejected("INVALID_ARGUMENT"), 1.0, "{users}");

    // Every metric and label the alert rules and the dashboard name is one these processes
    // export.
    let scrapes = [&student, &users, &relay];
    let exported: BTreeSet<String> = scrapes.iter().flat_map(|s| exported_names(s)).collect();
    let labels: BTreeSet<String> = scrapes.iter().flat_map(|s| label_names(s)).collect();
    let expressions = ops_expressions();
    assert!(expressions.len() >= 9, "{expressions:?}");
    for expr in &expressions {
        for name in promql_names(expr) {
            assert!(
                exported.contains(&name) || labels.contains(&name),
                "ops/ names {name:?} ({expr}), which no binary exports: {exported:?} {labels:?}"
            );
        }
    }

    // A shed call is counted too: with one call in flight at most, and the first one slow,
    // the second is shed at once.
    stack
        .restart_users_with(
            Some("users-on-request=sleep(1000)"),
            &[
                "--metrics-addr",
                "127.0.0.1:0",
                "--max-concurrent-requests",
                "1",
            ],
        )
        .await;
    let users_metrics = stack.metrics_addr("users-svc").await;
    let (mut first, mut second) = (stack.users_client(), stack.users_client());
    let (a, b) = tokio::join!(
        first.create_user(conflicting_user_request(100)),
        second.create_user(conflicting_user_request(101)),
    );
    let mut codes = [
        a.map_or_else(|s| s.code(), |_| Code::Ok),
        b.map_or_else(|s| s.code(), |_| Code::Ok),
    ];
    codes.sort_by_key(|code| *code as i32);
    assert_eq!(codes, [Code::Ok, Code::ResourceExhausted]);
    let users = scrape(users_metrics).await;
    let create_user = |code| {
        [
            ("grpc_service", "users.v1.UsersService"),
            ("grpc_method", "CreateUser"),
            ("grpc_code", code),
        ]
    };
    assert_eq!(
        sample(&users, "grpc_server_handled_total", &create_user("OK")),
        1.0,
        "{users}"
    );
    assert_eq!(
        sample(
            &users,
            "grpc_server_handled_total",
            &create_user("RESOURCE_EXHAUSTED")
        ),
        1.0,
        "{users}"
    );
}
