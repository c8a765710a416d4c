//! Following one student, against the three real binaries: one trace id names a student's
//! journey in every process's log lines, and with a collector named each hop is exported as
//! a span of that trace, with the parents, links and status the README describes; the
//! sampler picks whole journeys; spans the collector does not take are counted; a collector
//! the exporter cannot use stops a binary at start.

use std::{collections::BTreeSet, sync::atomic::Ordering, time::Duration};

use devstack::{Process, wait_until_serving};
use nix::sys::signal::Signal;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use proto::{
    student::v1::{
        CreateStudentRequest, UserLinkStatus, student_service_client::StudentServiceClient,
    },
    users::v1::users_service_client::UsersServiceClient,
};
use sea_orm::{EntityTrait as _, QueryOrder as _};
use student_store::entity::outbox;
use tonic::Code;
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{
        Backend, TestDatabases,
        app::spawn_app,
        certs::TestPki,
        collector::{Collector, ReceivedSpan, hex},
        commit_trap::refuse_to_commit_inbox_rows,
        conflicting_user_request, eventually,
        invariants::stored_user,
        metrics::{
            WITH_A_COLLECTOR, alert_test_series, exported_names, has_label_value, ops_expressions,
            promql_names, sample, scrape,
        },
        refusing_addr,
        scripted_users::{Script, scripted_users},
        stack::{LINK_DEADLINE, Stack, binaries, exits_within_30_s},
        student_request,
    },
};

on_both_backends!(
    one_trace_id_follows_a_student_through_the_three_processes,
    rows_sent_together_are_each_judged_under_their_own_trace,
    the_direct_flow_carries_the_callers_trace_to_users,
    each_hop_of_a_students_journey_is_a_span_of_its_trace_at_the_collector,
    the_direct_flows_call_to_users_is_a_span_of_the_callers_trace,
    the_sampler_named_exports_whole_journeys_or_none,
    a_sampler_that_is_not_parent_based_overrules_the_caller,
    spans_the_collector_did_not_take_are_counted,
    a_collector_that_never_answers_slows_no_call_and_holds_a_stop_at_most_5_s,
    spans_reach_an_https_collector_trusted_through_the_ca_file_named,
    spans_reach_a_collector_that_asks_for_a_client_certificate_only_with_its_own,
    a_collector_the_exporter_cannot_use_stops_the_binary_at_start,
    a_span_is_an_error_only_when_its_hop_failed,
    a_row_handed_back_unsent_has_no_delivery_span,
    a_row_failed_without_a_call_keeps_its_delivery_span,
    rows_of_a_call_refused_whole_each_show_the_refusal_then_their_own_delivery,
    items_of_a_call_whose_transaction_failed_are_each_a_failed_span,
    retry_failed_asks_users_about_a_rows_key_in_the_rows_trace,
    otel_sdk_disabled_exports_nothing,
);

/// Rows sent together (one CreateUsers call) belong to different students' journeys:
/// Users judges each item under the trace its row carries, not the call's, so each
/// student's `user created` line names that student's trace.
async fn rows_sent_together_are_each_judged_under_their_own_trace(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    let mut journeys = Vec::new();
    for n in 0..2 {
        let (trace_id, student) = create_traced(&stack.student_client(), n).await;
        journeys.push((student, trace_id));
    }
    stack.start_relay_sending_together();
    stack.wait_until_all_linked(2).await;
    let users_log = stack
        .wait_for_log_lines("users-svc", "user created", 2)
        .await;
    for (student, trace_id) in &journeys {
        let line = users_log
            .lines()
            .find(|line| line.contains("user created") && line.contains(student.as_str()))
            .unwrap_or_else(|| panic!("no user created for {student}:\n{users_log}"));
        assert!(line.contains("batch=2"), "sent together: {line}");
        assert!(
            line.contains(&format!("item{{trace_id={trace_id}}}")),
            "judged under {trace_id}: {line}"
        );
    }

    // The same in JSON lines: each item's line carries its row's trace id, and its
    // innermost span, not the call's.
    stack.kill_relays();
    stack
        .restart_users_with(None, &["--log-format", "json"])
        .await;
    let mut traces = Vec::new();
    for n in 2..4 {
        traces.push(create_traced(&stack.student_client(), n).await.0);
    }
    stack.start_relay_sending_together();
    stack.wait_until_all_linked(4).await;
    let users_log = stack
        .wait_for_log_lines("users-svc", "user created", 4)
        .await;
    for trace_id in &traces {
        let created: Vec<_> = users_log
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["trace_id"] == trace_id.as_str())
            .filter(|line| line["message"] == "user created")
            .collect();
        assert_eq!(created.len(), 1, "{trace_id}:\n{users_log}");
        assert_eq!(created[0]["span"], "item", "{}", created[0]);
        assert_eq!(created[0]["batch"], 2, "sent together: {}", created[0]);
    }
}

/// The baseline is measured and debugged like the design: `--link-mode direct` calls Users
/// under the caller's trace, so Users' lines for the user it creates name that trace.
async fn the_direct_flow_carries_the_callers_trace_to_users(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack
        .restart_users_with(None, &["--log-format", "json"])
        .await;
    let users_url = format!("http://{}", stack.users_addr);
    stack
        .restart_student_with(None, &["--link-mode", "direct", "--users-url", &users_url])
        .await;
    let trace_id = new_trace_id();
    stack
        .student_client()
        .create_student(with_trace(student_request(0), &trace_id))
        .await
        .expect("created through Users");
    eventually(
        "Users logs the user under the caller's trace",
        LINK_DEADLINE,
        || async {
            json_messages(&stack.log_of("users-svc"), &trace_id)
                .iter()
                .any(|message| message == "user created")
                .then_some(())
        },
    )
    .await;
}

/// `message` with metadata `traceparent: 00-<trace_id>-<span>-01` (a sampled caller).
fn with_trace<T>(message: T, trace_id: &str) -> tonic::Request<T> {
    with_trace_flags(message, trace_id, "01")
}

/// `message` with metadata `traceparent: 00-<trace_id>-<span>-<flags>`.
fn with_trace_flags<T>(message: T, trace_id: &str, flags: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{CALLER_SPAN}-{flags}")
            .parse()
            .expect("ASCII"),
    );
    request
}

/// README ("Following one student"): with a collector named (`OTEL_EXPORTER_OTLP_ENDPOINT`),
/// each hop of a student's journey is exported as a span of the caller's trace whose parent
/// is the hop before it: the CreateStudent call (its parent the caller's span), the relay's
/// delivery of the row (a client span, `linked`), and Users' execution of it; nothing else
/// is in the trace. Three students, each under a trace of its own, wait for the relay, so
/// it sends them in one CreateUsers call (a span of its own, linked to each item's) and each
/// item is a CreateUser span of its student's trace; a rename under a fourth trace is UpdateStudent, the relay's
/// UpdateUser delivery and Users' UpdateUser; `relay replay` of the second student adds a
/// client span of the replay, and Users' answer from its inbox, to that student's trace.
/// The binaries wait an hour between batches here, so the spans reach the collector only
/// because each one sends what it has queued when it stops (SIGTERM, or the replay's end).
async fn each_hop_of_a_students_journey_is_a_span_of_its_trace_at_the_collector(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let client = student_client(serving(&mut student).await);
    let mut traces = Vec::new();
    for n in 0..3 {
        traces.push(create_traced(&client, n).await);
    }
    let mut relay = relay_exporting(&dbs, &collector, &users_url);
    wait_until_linked(&client, traces.iter().map(|(_, id)| id)).await;
    let change_trace_id = new_trace_id();
    let current = client
        .clone()
        .get_student(proto::student::v1::GetStudentRequest {
            id: traces[0].1.clone(),
        })
        .await
        .expect("found")
        .into_inner();
    client
        .clone()
        .update_student(with_trace(
            proto::student::v1::UpdateStudentRequest {
                id: current.id.clone(),
                first_name: "Renamed".into(),
                last_name: current.last_name,
                email: current.email,
                idempotency_key: None,
                expected_version: current.version,
            },
            &change_trace_id,
        ))
        .await
        .expect("updated");
    let users_db = platform::db::connect(&dbs.users_url)
        .await
        .expect("Users DB");
    eventually("the rename reaches Users", LINK_DEADLINE, || async {
        let user = stored_user(&users_db, current.user_id.parse().expect("linked")).await;
        (user.first_name == "Renamed").then_some(())
    })
    .await;
    let mut replay = start_exporting(
        &dbs,
        &collector,
        "relay",
        &[
            "--users-url",
            &users_url,
            "replay",
            "--student",
            &traces[1].1,
        ],
    );
    let replayed = replay
        .wait_timeout(Duration::from_secs(30))
        .expect("wait")
        .expect("the replay ends");
    assert!(replayed.success(), "{replayed}");
    for process in [&mut relay, &mut student, &mut users] {
        stop(process);
    }
    assert_no_personal_data(&collector.spans(), 0..3);

    let batches: Vec<ReceivedSpan> = collector
        .spans()
        .into_iter()
        .filter(|received| received.span.name == "users.v1.UsersService/CreateUsers")
        .collect();
    assert_eq!(batches.len(), 1, "one CreateUsers call: {batches:#?}");
    assert_eq!(batches[0].service, "users-svc");
    // OTLP's span flags (0x100: whether the parent is known to be another process's;
    // 0x200: it is): the call's own span is a root, its parent known to be none.
    assert_eq!(batches[0].span.flags & 0x300, 0x100, "{:#?}", batches[0]);
    let mut linked: Vec<(String, String)> = batches[0]
        .span
        .links
        .iter()
        .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
        .collect();
    let mut items: Vec<(String, String)> = traces
        .iter()
        .map(|(trace_id, _)| {
            let spans = Spans(collector.spans_of(trace_id));
            let first = spans.earliest("users-svc", SpanKind::Server);
            (trace_id.clone(), hex(&first.span.span_id))
        })
        .collect();
    linked.sort();
    items.sort();
    assert_eq!(linked, items, "the call's span links to each item's");
    let journeys = traces
        .iter()
        .map(|(trace_id, _)| (trace_id, "CreateStudent", "CreateUser"))
        .chain([(&change_trace_id, "UpdateStudent", "UpdateUser")]);
    for (n, (trace_id, student_method, users_method)) in journeys.enumerate() {
        let spans = Spans(collector.spans_of(trace_id));
        let call = spans.only("student-svc", SpanKind::Server);
        assert_eq!(
            call.span.name,
            format!("student.v1.StudentService/{student_method}")
        );
        assert_eq!(hex(&call.span.parent_span_id), CALLER_SPAN);
        let users_method = format!("users.v1.UsersService/{users_method}");
        // The second student's trace holds its replay too: a delivery and an execution more.
        let sends = if n == 1 { 2 } else { 1 };
        let deliveries = spans.all("relay", SpanKind::Client, sends);
        let executions = spans.all("users-svc", SpanKind::Server, sends);
        for (delivery, execution) in deliveries.iter().zip(&executions) {
            assert_eq!(delivery.span.name, users_method);
            assert_eq!(delivery.span.parent_span_id, call.span.span_id);
            // On behalf of another process's span: the Student call that stored the row.
            assert_eq!(delivery.span.flags & 0x300, 0x300, "{delivery:#?}");
            assert_eq!(execution.span.name, users_method);
            assert_eq!(execution.span.parent_span_id, delivery.span.span_id);
        }
        // The relay's delivery says what became of the row; the replay changes no row.
        let outcomes: Vec<Option<String>> = deliveries
            .iter()
            .map(|delivery| delivery.attribute("outbox.outcome"))
            .collect();
        let linked = Some("linked".to_owned());
        let expected = if n == 1 {
            vec![linked, None]
        } else {
            vec![linked]
        };
        assert_eq!(outcomes, expected);
        assert_eq!(spans.0.len(), 1 + 2 * sends, "nothing else: {:#?}", spans.0);
    }
}

/// README ("Following one student"): the baseline's CreateStudent (`--link-mode direct`)
/// is a server span of the caller's trace, its call to Users a client span under it, and
/// Users' CreateUser a server span under that.
async fn the_direct_flows_call_to_users_is_a_span_of_the_callers_trace(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut student = start_exporting(
        &dbs,
        &collector,
        "student-svc",
        &["--link-mode", "direct", "--users-url", &users_url],
    );
    let (trace_id, _) = create_traced(&student_client(serving(&mut student).await), 0).await;
    for process in [&mut student, &mut users] {
        stop(process);
    }

    let spans = Spans(collector.spans_of(&trace_id));
    let call = spans.only("student-svc", SpanKind::Server);
    assert_eq!(call.span.name, "student.v1.StudentService/CreateStudent");
    assert_eq!(hex(&call.span.parent_span_id), CALLER_SPAN);
    let to_users = spans.only("student-svc", SpanKind::Client);
    assert_eq!(to_users.span.name, "users.v1.UsersService/CreateUser");
    assert_eq!(to_users.span.parent_span_id, call.span.span_id);
    // OTLP's span flags: whether the parent is known to be another process's (0x100), and
    // is (0x200). The call's parent is the caller's; the call to Users' is the call's own.
    assert_eq!(call.span.flags & 0x300, 0x300, "{call:#?}");
    assert_eq!(to_users.span.flags & 0x300, 0x100, "{to_users:#?}");
    let execution = spans.only("users-svc", SpanKind::Server);
    assert_eq!(execution.span.name, "users.v1.UsersService/CreateUser");
    assert_eq!(execution.span.parent_span_id, to_users.span.span_id);
    assert_eq!(spans.0.len(), 3, "nothing else: {:#?}", spans.0);
}

/// README ("Following one student"): a span's status says whether its hop failed, as
/// OpenTelemetry's gRPC conventions have it. A client span is an error for every code but
/// `OK`; a server span only for the codes that mean the server failed, so a CreateStudent
/// refused for its input is not an error (the caller's), while the baseline's CreateStudent
/// that could not reach Users is, and so is its call to Users. The relay's delivery of a
/// row while Users cannot be reached is an error, `retried`; the delivery that links the
/// row later is not, nor are Users' execution and the CreateStudent that stored the row.
async fn a_span_is_an_error_only_when_its_hop_failed(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let (_refusing, nobody) = refusing_addr();
    let nobody = format!("http://{nobody}");
    let mut direct = start_exporting(
        &dbs,
        &collector,
        "student-svc",
        &["--link-mode", "direct", "--users-url", &nobody],
    );
    let unreachable_trace = new_trace_id();
    let unreachable = student_client(serving(&mut direct).await)
        .create_student(with_trace(student_request(0), &unreachable_trace))
        .await
        .expect_err("Users cannot be reached");
    assert_eq!(unreachable.code(), Code::Unavailable, "{unreachable:?}");
    stop(&mut direct);

    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let client = student_client(serving(&mut student).await);
    let refused_trace = new_trace_id();
    let refused = client
        .clone()
        .create_student(with_trace(
            CreateStudentRequest {
                email: "not an address".into(),
                ..student_request(1)
            },
            &refused_trace,
        ))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let (journey_trace, id) = create_traced(&client, 2).await;
    let mut relay = start_exporting(&dbs, &collector, "relay", &["--users-url", &nobody, "run"]);
    let student_db = student_db_of(&dbs).await;
    outbox_rows_when(&student_db, "the row retried", |rows| {
        rows.len() == 1 && rows[0].attempts > 0
    })
    .await;
    stop(&mut relay);
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut relay = relay_exporting(&dbs, &collector, &users_url);
    wait_until_linked(&client, [&id]).await;
    for process in [&mut relay, &mut student, &mut users] {
        stop(process);
    }

    // The status OTLP carries: its code (0 unset, 1 ok, 2 error) and message.
    let status = |span: &ReceivedSpan| {
        let status = span.span.status.clone().unwrap_or_default();
        (status.code, status.message)
    };
    let code = |span: &ReceivedSpan| span.attribute("rpc.grpc.status_code");
    let unreachable = Spans(collector.spans_of(&unreachable_trace));
    for kind in [SpanKind::Server, SpanKind::Client] {
        let span = unreachable.only("student-svc", kind);
        assert_eq!(code(&span).as_deref(), Some("14"), "UNAVAILABLE: {span:#?}");
        assert_eq!(status(&span).0, 2, "an error: {span:#?}");
        assert!(!status(&span).1.is_empty(), "with the reason: {span:#?}");
    }
    assert_eq!(unreachable.0.len(), 2, "nothing else: {:#?}", unreachable.0);

    let refused = Spans(collector.spans_of(&refused_trace));
    let call = refused.only("student-svc", SpanKind::Server);
    assert_eq!(
        code(&call).as_deref(),
        Some("3"),
        "INVALID_ARGUMENT: {call:#?}"
    );
    assert_eq!(
        status(&call),
        (0, String::new()),
        "not the server's error: {call:#?}"
    );
    assert_eq!(refused.0.len(), 1, "nothing else: {:#?}", refused.0);

    let journey = Spans(collector.spans_of(&journey_trace));
    let call = journey.only("student-svc", SpanKind::Server);
    assert_eq!(code(&call).as_deref(), Some("0"), "{call:#?}");
    assert_eq!(status(&call), (0, String::new()), "{call:#?}");
    // The first relay may have tried more than once before it stopped: each try is a
    // `retried` error, then the one delivery that links the row.
    let tries = journey
        .0
        .iter()
        .filter(|span| span.service == "relay")
        .count();
    assert!(tries >= 2, "{:#?}", journey.0);
    let deliveries = journey.all("relay", SpanKind::Client, tries);
    let outcomes: Vec<_> = deliveries
        .iter()
        .map(|delivery| (delivery.attribute("outbox.outcome"), status(delivery).0))
        .collect();
    let mut expected = vec![(Some("retried".to_owned()), 2); tries - 1];
    expected.push((Some("linked".to_owned()), 0));
    assert_eq!(outcomes, expected, "{deliveries:#?}");
    assert!(!status(&deliveries[0]).1.is_empty(), "{deliveries:#?}");
    let execution = journey.only("users-svc", SpanKind::Server);
    assert_eq!(code(&execution).as_deref(), Some("0"), "{execution:#?}");
    assert_eq!(status(&execution), (0, String::new()), "{execution:#?}");
    assert_eq!(journey.0.len(), 2 + tries, "nothing else: {:#?}", journey.0);
}

/// README ("Following one student"): a delivery span stands for a call to Users. A row the
/// relay hands back unsent, because its lease has less left than a call may take, has no
/// span; the delivery that sends it later has one. The relay (5 s lease, 3 s calls) stalls
/// 2.5 s after its first claim, so it hands back every row of that claim, claims them again
/// and sends each once; both ways a row is sent are checked, alone (`--rows-per-call 1`,
/// one student) and in a CreateUsers call (two students).
async fn a_row_handed_back_unsent_has_no_delivery_span(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let client = student_client(serving(&mut student).await);
    let stall = [("FAILPOINTS", "relay-after-claim=1*sleep(2500)")];
    let mut traces = Vec::new();
    for (rows_per_call, students) in [("1", 0..1), ("16", 1..3)] {
        let mut ids = Vec::new();
        for n in students {
            let (trace_id, id) = create_traced(&client, n).await;
            ids.push(id);
            traces.push(trace_id);
        }
        let mut relay = start_exporting_with(
            &dbs,
            &collector,
            &stall,
            "relay",
            &[
                "--users-url",
                &users_url,
                "run",
                "--lease",
                "5s",
                "--call-timeout",
                "3s",
                "--rows-per-call",
                rows_per_call,
            ],
        );
        wait_until_linked(&client, &ids).await;
        stop(&mut relay);
    }
    for process in [&mut student, &mut users] {
        stop(process);
    }

    let relay_log = std::fs::read_to_string(dbs.dir.path().join("relay.log")).expect("the log");
    assert_eq!(
        relay_log.matches("lease too short to send").count(),
        3,
        "each row handed back once: {relay_log}"
    );
    for trace_id in &traces {
        let spans = Spans(collector.spans_of(trace_id));
        let delivery = spans.only("relay", SpanKind::Client);
        assert_eq!(
            delivery.attribute("outbox.outcome").as_deref(),
            Some("linked"),
            "{delivery:#?}"
        );
        assert_eq!(
            spans.0.len(),
            3,
            "the call, the delivery, Users': {:#?}",
            spans.0
        );
    }
}

/// README ("Following one student"): a row the relay fails without calling Users (here its
/// stored payload does not decode) keeps its delivery span, `failed` and an error, so the
/// student's trace says how its journey ended; Users, never called, has no span in it.
async fn a_row_failed_without_a_call_keeps_its_delivery_span(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let (trace_id, _) = create_traced(&student_client(serving(&mut student).await), 0).await;
    let student_db = student_db_of(&dbs).await;
    outbox::Entity::update_many()
        .col_expr(
            outbox::Column::Payload,
            sea_orm::sea_query::Expr::value(serde_json::json!({ "version": 1, "email": 7 })),
        )
        .exec(&student_db)
        .await
        .expect("spoil the row's payload");
    let mut relay = relay_exporting(&dbs, &collector, &users_url);
    outbox_rows_when(&student_db, "the row failed", |rows| {
        rows.len() == 1 && rows[0].status == outbox::OutboxStatus::Failed
    })
    .await;
    for process in [&mut relay, &mut student, &mut users] {
        stop(process);
    }

    let spans = Spans(collector.spans_of(&trace_id));
    let delivery = spans.only("relay", SpanKind::Client);
    let status = delivery.span.status.clone().unwrap_or_default();
    assert_eq!(
        (delivery.attribute("outbox.outcome").as_deref(), status.code),
        (Some("failed"), 2),
        "{delivery:#?}"
    );
    assert_eq!(
        spans.0.len(),
        2,
        "the call and the delivery: {:#?}",
        spans.0
    );
}

/// README ("Following one student"): rows sent together whose CreateUsers call Users
/// refuses as a whole (here UNIMPLEMENTED, as a Users older than the method answers) are
/// sent again one CreateUser call each; each row's trace shows both: a delivery that
/// failed with the refusal (no outcome: the row was not concluded), then the one that
/// linked it. The relay is a real process exporting to the collector; both services run
/// in the test, exporting nothing, so the relay's spans are all there is.
async fn rows_of_a_call_refused_whole_each_show_the_refusal_then_their_own_delivery(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let users = scripted_users(
        &app,
        Script {
            refuse_create_users: Some(Code::Unimplemented),
            ..Script::default()
        },
    )
    .await;
    let mut journeys = Vec::new();
    for n in 0..2 {
        journeys.push(create_traced(&app.student, n).await);
    }
    let mut relay = start_exporting(
        &app.databases,
        &collector,
        "relay",
        &["--users-url", &users.url, "run"],
    );
    wait_until_linked(&app.student, journeys.iter().map(|(_, id)| id)).await;
    stop(&mut relay);

    assert_eq!(users.create_users_calls.load(Ordering::SeqCst), 1);
    for (trace_id, _) in &journeys {
        let spans = Spans(collector.spans_of(trace_id));
        let deliveries = spans.all("relay", SpanKind::Client, 2);
        let seen: Vec<_> = deliveries
            .iter()
            .map(|delivery| {
                let status = delivery.span.status.clone().unwrap_or_default();
                (
                    delivery.span.name.as_str(),
                    delivery.attribute("outbox.outcome"),
                    status.code,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("users.v1.UsersService/CreateUser", None, 2),
                (
                    "users.v1.UsersService/CreateUser",
                    Some("linked".to_owned()),
                    0
                ),
            ],
            "{deliveries:#?}"
        );
        assert_eq!(spans.0.len(), 2, "nothing else: {:#?}", spans.0);
    }
}

/// README ("Following one student"): rows sent together share one transaction at Users;
/// when its commit fails (the Users DB refuses it here), each item is a failed CreateUser
/// span of its own row's trace (INTERNAL, an error: the server failed), the call's own
/// span fails the same way, and the relay's deliveries of the rows are `retried` errors.
async fn items_of_a_call_whose_transaction_failed_are_each_a_failed_span(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let users_db = platform::db::connect(&dbs.users_url)
        .await
        .expect("Users DB");
    refuse_to_commit_inbox_rows(&users_db, backend, None).await;
    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let client = student_client(serving(&mut student).await);
    let mut traces = Vec::new();
    for n in 0..2 {
        traces.push(create_traced(&client, n).await.0);
    }
    let mut relay = relay_exporting(&dbs, &collector, &users_url);
    let student_db = student_db_of(&dbs).await;
    outbox_rows_when(&student_db, "both rows retried", |rows| {
        rows.iter()
            .all(|row| row.status == outbox::OutboxStatus::Pending && row.attempts > 0)
    })
    .await;
    for process in [&mut relay, &mut student, &mut users] {
        stop(process);
    }

    // Whether a span's status is an error, with a message.
    let failed = |span: &ReceivedSpan| {
        let status = span.span.status.clone().unwrap_or_default();
        status.code == 2 && !status.message.is_empty()
    };
    let calls: Vec<ReceivedSpan> = collector
        .spans()
        .into_iter()
        .filter(|received| received.span.name == "users.v1.UsersService/CreateUsers")
        .collect();
    assert!(!calls.is_empty(), "a CreateUsers call");
    for call in &calls {
        assert!(failed(call), "{call:#?}");
        assert_eq!(
            call.attribute("rpc.grpc.status_code").as_deref(),
            Some("13")
        );
    }
    for trace_id in &traces {
        let spans = Spans(collector.spans_of(trace_id));
        let at_users: Vec<&ReceivedSpan> = spans
            .0
            .iter()
            .filter(|span| span.service == "users-svc")
            .collect();
        let deliveries: Vec<&ReceivedSpan> = spans
            .0
            .iter()
            .filter(|span| span.service == "relay")
            .collect();
        assert!(
            !at_users.is_empty() && at_users.len() == deliveries.len(),
            "{:#?}",
            spans.0
        );
        for item in at_users {
            assert_eq!(item.span.name, "users.v1.UsersService/CreateUser");
            assert_eq!(
                item.attribute("rpc.grpc.status_code").as_deref(),
                Some("13")
            );
            assert!(failed(item), "{item:#?}");
        }
        for delivery in deliveries {
            assert_eq!(
                delivery.attribute("outbox.outcome").as_deref(),
                Some("retried")
            );
            assert!(failed(delivery), "{delivery:#?}");
        }
    }
}

/// README ("Following one student"): the question `relay retry-failed --new-key` asks
/// Users about a failed row's key (replay-only, so it can execute nothing) is a client span
/// of the row's trace, named after the row's Users method, with `outbox.id` and no outcome,
/// whose parent is the Student call that stored the row; Users' answer from its inbox is a
/// server span under it. The row was rejected (somebody else holds the student's document
/// number), so the trace holds the call, the delivery (`failed`) and Users' execution,
/// then the question and Users' replay.
async fn retry_failed_asks_users_about_a_rows_key_in_the_rows_trace(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut users = start_exporting(&dbs, &collector, "users-svc", &[]);
    let users_addr = serving(&mut users).await;
    let users_url = format!("http://{users_addr}");
    users_client(users_addr)
        .create_user(conflicting_user_request(0))
        .await
        .expect("somebody else holds student 0's document number");
    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let (trace_id, _) = create_traced(&student_client(serving(&mut student).await), 0).await;
    let mut relay = relay_exporting(&dbs, &collector, &users_url);
    let student_db = student_db_of(&dbs).await;
    let row = outbox_rows_when(&student_db, "the row rejected", |rows| {
        rows.len() == 1 && rows[0].status == outbox::OutboxStatus::Failed
    })
    .await
    .remove(0);
    stop(&mut relay);
    let mut retry = start_exporting(
        &dbs,
        &collector,
        "relay",
        &[
            "--users-url",
            &users_url,
            "retry-failed",
            "--all",
            "--new-key",
        ],
    );
    let retried = retry
        .wait_timeout(Duration::from_secs(30))
        .expect("wait")
        .expect("retry-failed ends");
    assert!(retried.success(), "{retried}");
    for process in [&mut student, &mut users] {
        stop(process);
    }
    assert_no_personal_data(&collector.spans(), 0..1);

    let spans = Spans(collector.spans_of(&trace_id));
    let call = spans.only("student-svc", SpanKind::Server);
    let [delivery, question] =
        <[ReceivedSpan; 2]>::try_from(spans.all("relay", SpanKind::Client, 2)).expect("two");
    let [execution, replay] =
        <[ReceivedSpan; 2]>::try_from(spans.all("users-svc", SpanKind::Server, 2)).expect("two");
    assert_eq!(
        delivery.attribute("outbox.outcome").as_deref(),
        Some("failed")
    );
    for span in [&delivery, &question, &execution, &replay] {
        assert_eq!(
            span.span.name, "users.v1.UsersService/CreateUser",
            "{span:#?}"
        );
    }
    for asked in [&delivery, &question] {
        assert_eq!(asked.span.parent_span_id, call.span.span_id, "{asked:#?}");
        assert_eq!(
            asked.attribute("outbox.id"),
            Some(row.id.to_string()),
            "{asked:#?}"
        );
    }
    assert_eq!(question.attribute("outbox.outcome"), None, "{question:#?}");
    assert_eq!(execution.span.parent_span_id, delivery.span.span_id);
    assert_eq!(replay.span.parent_span_id, question.span.span_id);
    assert_eq!(spans.0.len(), 5, "nothing else: {:#?}", spans.0);
}

/// README ("Following one student"): with `OTEL_TRACES_SAMPLER=parentbased_traceidratio`
/// and `OTEL_TRACES_SAMPLER_ARG=0.5` in all three binaries, a CreateStudent that arrives
/// without a trace starts one, sampled when its id falls in half of all ids (its low 64
/// bits, halved, below 2^62), and every later hop follows that decision: the outbox row
/// stores it, the relay's delivery and Users' execution are exported exactly when the call
/// was, so each journey reaches the collector whole or not at all. A caller's decision wins
/// over the ratio both ways (a sampled caller's trace whose id the ratio would leave out,
/// and the reverse).
async fn the_sampler_named_exports_whole_journeys_or_none(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let sampler = [
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
    ];
    let mut users = start_exporting_with(&dbs, &collector, &sampler, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut student = start_exporting_with(&dbs, &collector, &sampler, "student-svc", &[]);
    let client = student_client(serving(&mut student).await);
    let in_ratio = |trace_id: &str| {
        let low = u64::from_str_radix(&trace_id[16..], 16).expect("hex");
        (low >> 1) < 1 << 62
    };
    // Callers' traces: (trace id, the caller's flags); each id is one the ratio would
    // decide the other way.
    let callers = [
        (
            format!("{:016x}{:016x}", Uuid::new_v4().as_u128() >> 64, u64::MAX),
            "01",
        ),
        (
            format!("{:016x}{:016x}", Uuid::new_v4().as_u128() >> 64, 0),
            "00",
        ),
    ];
    let mut students = Vec::new();
    for (n, (trace_id, flags)) in callers.iter().enumerate() {
        assert_eq!(in_ratio(trace_id), *flags == "00");
        let request = with_trace_flags(student_request(n), trace_id, flags);
        students.push(
            client
                .clone()
                .create_student(request)
                .await
                .expect("created"),
        );
    }
    for n in callers.len()..callers.len() + 24 {
        let request = tonic::Request::new(student_request(n));
        students.push(
            client
                .clone()
                .create_student(request)
                .await
                .expect("created"),
        );
    }
    let ids: Vec<String> = students
        .into_iter()
        .map(|created| created.into_inner().id)
        .collect();
    let mut relay = start_exporting_with(
        &dbs,
        &collector,
        &sampler,
        "relay",
        &["--users-url", &users_url, "run"],
    );
    wait_until_linked(&client, &ids).await;
    for process in [&mut relay, &mut student, &mut users] {
        stop(process);
    }

    // What each student's row stored: its trace, and whether it is sampled.
    let student_db = student_db_of(&dbs).await;
    let rows = outbox::Entity::find()
        .order_by_asc(outbox::Column::Id)
        .all(&student_db)
        .await
        .expect("outbox");
    assert_eq!(rows.len(), ids.len());
    let stored: Vec<(String, bool)> = rows
        .iter()
        .map(|row| {
            let traceparent = row.traceparent.as_deref().expect("a trace stored");
            let (trace_id, flags) = (&traceparent[3..35], &traceparent[53..]);
            (trace_id.to_owned(), flags == "01")
        })
        .collect();
    for ((trace_id, sampled), (caller, flags)) in stored.iter().zip(&callers) {
        assert_eq!(trace_id, caller);
        assert_eq!(*sampled, *flags == "01", "the caller decides {trace_id}");
    }
    let started_here = &stored[callers.len()..];
    for (trace_id, sampled) in started_here {
        assert_eq!(*sampled, in_ratio(trace_id), "the ratio decides {trace_id}");
    }
    // 24 at one half: all one way would be odds of 2^-23.
    let picked = started_here.iter().filter(|(_, sampled)| *sampled).count();
    assert!(
        0 < picked && picked < started_here.len(),
        "{picked} sampled"
    );

    // The collector holds exactly the sampled journeys, each whole: the call, the delivery,
    // Users' execution (CreateUsers calls are spans of a trace of their own).
    let exported: BTreeSet<String> = collector
        .spans()
        .into_iter()
        .filter(|received| received.span.name != "users.v1.UsersService/CreateUsers")
        .map(|received| hex(&received.span.trace_id))
        .collect();
    let sampled: BTreeSet<String> = stored
        .iter()
        .filter(|(_, sampled)| *sampled)
        .map(|(trace_id, _)| trace_id.clone())
        .collect();
    assert_eq!(exported, sampled);
    for trace_id in &sampled {
        let spans = Spans(collector.spans_of(trace_id));
        spans.only("student-svc", SpanKind::Server);
        spans.only("relay", SpanKind::Client);
        spans.only("users-svc", SpanKind::Server);
        assert_eq!(spans.0.len(), 3, "{trace_id}: {:#?}", spans.0);
    }
}

/// README ("Following one student"): a sampler that is not parent-based decides each hop
/// alone, whatever the hop before it decided. student-svc keeps the default
/// (`parentbased_always_on`: the caller decides); the relay and users-svc run
/// `OTEL_TRACES_SAMPLER=traceidratio` at one half. A student created under a caller's
/// trace that is not sampled, whose id is in the ratio: its CreateStudent is not exported,
/// its delivery and Users' execution are. One under a sampled caller's trace whose id is
/// out of the ratio: only its CreateStudent is.
async fn a_sampler_that_is_not_parent_based_overrules_the_caller(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let ratio = [
        ("OTEL_TRACES_SAMPLER", "traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
    ];
    let mut users = start_exporting_with(&dbs, &collector, &ratio, "users-svc", &[]);
    let users_url = format!("http://{}", serving(&mut users).await);
    let mut student = start_exporting(&dbs, &collector, "student-svc", &[]);
    let client = student_client(serving(&mut student).await);
    let high = Uuid::new_v4().as_u128() >> 64;
    // (trace id, the caller's flags, spans exported by student-svc, the relay, users-svc):
    // low 64 bits 0 are in any ratio above 0, all ones in none below 1.
    let journeys = [
        (format!("{high:016x}{:016x}", 0), "00", [0, 1, 1]),
        (format!("{high:016x}{:016x}", u64::MAX), "01", [1, 0, 0]),
    ];
    let mut ids = Vec::new();
    for (n, (trace_id, flags, _)) in journeys.iter().enumerate() {
        let request = with_trace_flags(student_request(n), trace_id, flags);
        let created = client
            .clone()
            .create_student(request)
            .await
            .expect("created");
        ids.push(created.into_inner().id);
    }
    let mut relay = start_exporting_with(
        &dbs,
        &collector,
        &ratio,
        "relay",
        &["--users-url", &users_url, "run"],
    );
    wait_until_linked(&client, &ids).await;
    for process in [&mut relay, &mut student, &mut users] {
        stop(process);
    }
    for (trace_id, flags, [by_student, by_relay, by_users]) in &journeys {
        let spans = Spans(collector.spans_of(trace_id));
        spans.all("student-svc", SpanKind::Server, *by_student);
        spans.all("relay", SpanKind::Client, *by_relay);
        spans.all("users-svc", SpanKind::Server, *by_users);
        assert_eq!(
            spans.0.len(),
            by_student + by_relay + by_users,
            "the caller's flags {flags}: {:#?}",
            spans.0
        );
    }
}

/// README ("Following one student"): `OTEL_SDK_DISABLED=true`, the SDK's own switch, turns
/// exporting off though a collector is named. Two users-svc name the same collector; each
/// creates a user under a trace of its own; only the one not disabled exports its span.
async fn otel_sdk_disabled_exports_nothing(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let mut traces = Vec::new();
    for (n, env) in [&[("OTEL_SDK_DISABLED", "true")][..], &[]]
        .into_iter()
        .enumerate()
    {
        let mut users = start_exporting_with(&dbs, &collector, env, "users-svc", &[]);
        let trace_id = new_trace_id();
        users_client(serving(&mut users).await)
            .create_user(with_trace(conflicting_user_request(n), &trace_id))
            .await
            .expect("created");
        stop(&mut users);
        traces.push(trace_id);
    }
    assert!(
        collector.spans_of(&traces[0]).is_empty(),
        "disabled, yet exported"
    );
    assert_eq!(
        collector.spans_of(&traces[1]).len(),
        1,
        "the control exports"
    );
}

/// README ("Following one student", "Metrics"): what became of the spans is counted.
/// The counts are exported at 0 from the first scrape. users-svc exporting to an address
/// where no collector listens (a batch every 100 ms) answers five CreateUser calls; their
/// five spans are counted ended, and failed, none sent. Exporting to a live collector, five more are ended and sent, none failed, and the
/// collector holds them.
async fn spans_the_collector_did_not_take_are_counted(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let nobody = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        format!("http://{}", listener.local_addr().expect("its address"))
    };
    for (round, endpoint) in [(0, nobody), (1, collector.endpoint())] {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ];
        let args = ["--metrics-addr", "127.0.0.1:0"];
        let mut users = start_exporting_with(&dbs, &collector, &env, "users-svc", &args);
        let addr = serving(&mut users).await;
        let metrics = metrics_addr_in(users.log_path());
        // Exported at 0 before any span, so that an alert's `increase()` sees the first.
        let before = scrape(metrics).await;
        for series in [
            "trace_spans_ended_total 0",
            "trace_spans_exported_total{result=\"sent\"} 0",
            "trace_spans_exported_total{result=\"failed\"} 0",
        ] {
            assert!(
                before.lines().any(|line| line == series),
                "{series}:\n{before}"
            );
        }
        let client = users_client(addr);
        let mut traces = Vec::new();
        for n in 0..5 {
            let trace_id = new_trace_id();
            client
                .clone()
                .create_user(with_trace(
                    conflicting_user_request(10 * round + n),
                    &trace_id,
                ))
                .await
                .expect("created");
            traces.push(trace_id);
        }
        let (sent, failed) = if round == 0 { (0.0, 5.0) } else { (5.0, 0.0) };
        let counted = eventually(
            "every span's batch sent or failed",
            LINK_DEADLINE,
            || async {
                let text = scrape(metrics).await;
                let exported =
                    |result| sample(&text, "trace_spans_exported_total", &[("result", result)]);
                let counts = (
                    sample(&text, "trace_spans_ended_total", &[]),
                    exported("sent"),
                    exported("failed"),
                );
                (counts.1 + counts.2 >= 5.0).then_some(counts)
            },
        )
        .await;
        assert_eq!(counted, (5.0, sent, failed), "round {round}");
        // What ops/ names of these metrics is what the binary exports, down to the label
        // values its alert tests feed (the other metrics are checked by
        // `metrics_of_each_process_move_as_work_is_done`, without a collector).
        let text = scrape(metrics).await;
        let names = ops_expressions()
            .iter()
            .flat_map(|expr| promql_names(expr))
            .filter(|name| name.starts_with("trace_spans_"))
            .collect::<Vec<_>>();
        assert!(!names.is_empty());
        for name in names {
            assert!(exported_names(&text).contains(&name), "{name}:\n{text}");
        }
        for (name, labels) in alert_test_series() {
            if WITH_A_COLLECTOR.contains(&name.as_str()) {
                for (key, value) in &labels {
                    if !["job", "instance"].contains(&key.as_str()) {
                        assert!(
                            has_label_value(&text, &name, key, value),
                            "{name} {key}={value}"
                        );
                    }
                }
            }
        }
        stop(&mut users);
        let received: usize = traces
            .iter()
            .map(|trace_id| collector.spans_of(trace_id).len())
            .sum();
        assert_eq!(received, if round == 0 { 0 } else { 5 }, "round {round}");
    }
}

/// README ("Following one student"): exporting never slows or fails a call, and a binary
/// that stops waits at most 5 s for the collector. Here the collector accepts connections
/// and never answers (a hung collector, or a network that drops its replies), the batch
/// processor tries to send every 50 ms, and the export's own deadline is 30 s: 30
/// CreateUser calls are each answered within their 2 s deadline, and SIGTERM ends the
/// process within 10 s (5 s and a little; were it to wait for the export's own deadline,
/// 30 s), saying the queued spans were not sent.
async fn a_collector_that_never_answers_slows_no_call_and_holds_a_stop_at_most_5_s(
    backend: Backend,
) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let collector = Collector::start().await;
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hung_endpoint = format!("http://{}", hung.local_addr().expect("its address"));
    // Accepts each connection and holds it open, reading and writing nothing.
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = hung.accept().await {
            held.push(connection);
        }
    });
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", hung_endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "30000"),
    ];
    let mut users = start_exporting_with(&dbs, &collector, &env, "users-svc", &[]);
    let addr = serving(&mut users).await;
    let client = users_client(addr);
    for n in 0..30 {
        let mut request = with_trace(conflicting_user_request(n), &new_trace_id());
        request.set_timeout(Duration::from_secs(2));
        client
            .clone()
            .create_user(request)
            .await
            .unwrap_or_else(|status| panic!("call {n}: {status:?}"));
    }
    let stopping = std::time::Instant::now();
    users.signal(Signal::SIGTERM).expect("SIGTERM");
    let status = users
        .wait_timeout(Duration::from_secs(20))
        .expect("wait")
        .expect("users-svc stops within 20 s");
    assert!(status.success(), "{status}");
    // A bound on a wait, not a speed: 5 s and the rest of the stop, with room for a busy
    // machine; a wait of twice the promise fails it.
    let stopped_after = stopping.elapsed();
    assert!(
        stopped_after < Duration::from_secs(10),
        "the stop took {stopped_after:?}"
    );
    let log = std::fs::read_to_string(users.log_path()).expect("the log");
    assert!(
        log.contains("spans still queued for the collector were not sent"),
        "{log}"
    );
    holding.abort();
}

/// The address the last process to write the log `log` logged as `metrics_addr=`.
fn metrics_addr_in(log: &std::path::Path) -> std::net::SocketAddr {
    let text = std::fs::read_to_string(log).expect("the log");
    let (_, rest) = text
        .rsplit_once("metrics_addr=")
        .unwrap_or_else(|| panic!("no metrics_addr= in {text}"));
    rest.split_whitespace()
        .next()
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no address after metrics_addr= in {text}"))
}

/// README ("Following one student"): an `https://` collector is trusted through the CA file
/// `OTEL_EXPORTER_OTLP_CERTIFICATE` names. users-svc exporting to a collector whose CA is
/// not among the system's roots sends nothing it would accept; given the CA, its call's
/// span arrives, under the service name `OTEL_RESOURCE_ATTRIBUTES` gives, or
/// `OTEL_SERVICE_NAME` (which wins where both name one, as OpenTelemetry specifies).
async fn spans_reach_an_https_collector_trusted_through_the_ca_file_named(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let pki = TestPki::new();
    let (ca, _, _) = pki.write_to(dbs.dir.path());
    let collector = Collector::start_tls(pki.identity()).await;
    let ca = ca.to_string_lossy();
    let attributes = (
        "OTEL_RESOURCE_ATTRIBUTES",
        "service.name=users-eu-1,deployment.environment=test",
    );
    // Each round: the environment users-svc exports under, and the service name its span
    // must arrive with (none: nothing arrives).
    type Round<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let rounds: [Round; 3] = [
        (&[], None),
        (
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca), attributes],
            Some("users-eu-1"),
        ),
        (
            &[
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
                attributes,
                ("OTEL_SERVICE_NAME", "users-eu-2"),
            ],
            Some("users-eu-2"),
        ),
    ];
    for (round, (env, service)) in rounds.into_iter().enumerate() {
        let mut users = start_exporting_with(&dbs, &collector, env, "users-svc", &[]);
        let addr = serving(&mut users).await;
        let trace_id = new_trace_id();
        users_client(addr)
            .create_user(with_trace(conflicting_user_request(round), &trace_id))
            .await
            .expect("created");
        stop(&mut users);
        let spans = Spans(collector.spans_of(&trace_id));
        match service {
            Some(service) => {
                let call = spans.only(service, SpanKind::Server);
                assert_eq!(call.span.name, "users.v1.UsersService/CreateUser");
            }
            None => assert!(
                spans.0.is_empty(),
                "an untrusted collector got {:#?}",
                spans.0
            ),
        }
    }
}

/// README ("Following one student"): a collector that asks for a client certificate
/// (mutual TLS) gets spans from a binary that shows the one
/// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `..._CLIENT_KEY` name (here through the
/// `..._TRACES_...` variants, which win), signed by a CA it trusts; a binary that shows
/// none, or one a CA it does not know signed, sends it nothing.
async fn spans_reach_a_collector_that_asks_for_a_client_certificate_only_with_its_own(
    backend: Backend,
) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let pki = TestPki::new();
    let (ca, certificate, key) = pki.write_to(dbs.dir.path());
    let strangers = dbs.dir.path().join("strangers");
    std::fs::create_dir(&strangers).expect("a directory");
    let (_, stranger_certificate, stranger_key) = TestPki::new().write_to(&strangers);
    // The collector's own certificate, signed by the CA it trusts for clients, is the
    // client certificate the binary shows.
    let collector = Collector::start_mutual_tls(
        pki.identity(),
        tonic::transport::Certificate::from_pem(&pki.ca_pem),
    )
    .await;
    let path = |path: &std::path::Path| path.to_string_lossy().into_owned();
    let ca = path(&ca);
    let (certificate, key) = (path(&certificate), path(&key));
    let (stranger_certificate, stranger_key) = (path(&stranger_certificate), path(&stranger_key));
    let cases: [(&str, Vec<(&str, &str)>); 3] = [
        ("no client certificate", vec![]),
        (
            "a stranger's",
            vec![
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    &stranger_certificate,
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &stranger_key),
            ],
        ),
        (
            "its own",
            vec![
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    &stranger_certificate,
                ),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &stranger_key),
                ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", &certificate),
                ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", &key),
            ],
        ),
    ];
    for (n, (case, client)) in cases.iter().enumerate() {
        let env: Vec<(&str, &str)> = [("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())]
            .into_iter()
            .chain(client.iter().copied())
            .collect();
        let mut users = start_exporting_with(&dbs, &collector, &env, "users-svc", &[]);
        let addr = serving(&mut users).await;
        let trace_id = new_trace_id();
        users_client(addr)
            .create_user(with_trace(conflicting_user_request(n), &trace_id))
            .await
            .expect("created");
        stop(&mut users);
        let spans = Spans(collector.spans_of(&trace_id));
        if *case == "its own" {
            let call = spans.only("users-svc", SpanKind::Server);
            assert_eq!(call.span.name, "users.v1.UsersService/CreateUser");
        } else {
            assert!(spans.0.is_empty(), "{case}: {:#?}", spans.0);
        }
    }
}

/// README ("Following one student"): a collector endpoint, CA file, protocol or sampler the
/// exporter cannot use stops the binary at start, naming it; the relay's one-shot commands
/// exit 2. Without an endpoint, a sampler it could not use stops nothing: it is not read.
async fn a_collector_the_exporter_cannot_use_stops_the_binary_at_start(backend: Backend) {
    let Some(dbs) = TestDatabases::create(backend).await else {
        return;
    };
    let missing = dbs.dir.path().join("missing-ca.pem");
    let missing = missing.to_string_lossy();
    let missing_key = dbs.dir.path().join("missing-key.pem");
    let missing_key = missing_key.to_string_lossy();
    let junk = dbs.dir.path().join("junk.pem");
    std::fs::write(&junk, "not PEM\n").expect("write");
    let junk = junk.to_string_lossy();
    let (_, certificate, _) = TestPki::new().write_to(dbs.dir.path());
    let certificate = certificate.to_string_lossy();
    // What is wrong, the variables that say it, and what the error must name.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 11] = [
        (
            "a CA file that is not there",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", &missing),
            ],
            "missing-ca.pem",
        ),
        (
            "a client certificate without its key",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", &junk),
            ],
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE names a client certificate but no key is \
             named for it (OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY)",
        ),
        (
            "a client key without its certificate",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &junk),
            ],
            "OTEL_EXPORTER_OTLP_CLIENT_KEY names a client key but no certificate",
        ),
        (
            "a client key file that is not there",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &junk),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &missing_key),
            ],
            "missing-key.pem",
        ),
        (
            "a client key that is no key",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &certificate),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &junk),
            ],
            "Error parsing TLS private key",
        ),
        (
            "an endpoint that is no URL",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")],
            "not a url",
        ),
        (
            // The traces-only variable alone names a collector too.
            "a traces endpoint that is no URL",
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "not a traces url")],
            "not a traces url",
        ),
        (
            // And it wins over the general one.
            "a traces endpoint that is no URL, beside a general one that is",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "not a traces url"),
            ],
            "not a traces url",
        ),
        (
            "a protocol not built in",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ],
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL \"http/protobuf\"",
        ),
        (
            "a sampler that does not exist",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_TRACES_SAMPLER", "sometimes"),
            ],
            "sometimes",
        ),
        (
            "a sampler's ratio that is no number",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "10%"),
            ],
            "10%",
        ),
    ];
    for (case, env, named) in cases {
        for (binary, args, exit) in [
            (
                "users-svc",
                &["--listen", "127.0.0.1:0", "--database-url", &dbs.users_url][..],
                1,
            ),
            (
                "relay",
                &["--database-url", &dbs.student_url, "status"][..],
                2,
            ),
        ] {
            let output = exits_within_30_s(
                tokio::process::Command::new(binaries().join(binary))
                    .args(args)
                    .env_clear()
                    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                    .envs(env.iter().copied()),
                &format!("{binary}, {case}"),
            )
            .await;
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(exit),
                "{binary}, {case}: {stderr}"
            );
            assert!(stderr.contains(named), "{binary}, {case}: {stderr}");
        }
    }
    // Without a collector named, nothing of the exporter's is read: with the same sampler
    // the relay goes on to its database (which has no schema yet here: what it says).
    let output = tokio::process::Command::new(binaries().join("relay"))
        .args(["--database-url", &dbs.student_url, "status"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("OTEL_TRACES_SAMPLER", "sometimes")
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no schema yet"), "{stderr}");
    assert!(!stderr.contains("sometimes"), "{stderr}");
}

/// The span id of the caller `with_trace` makes every request come from.
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A relay (`relay run`) delivering to `users_url`, exporting to `collector`.
fn relay_exporting(dbs: &TestDatabases, collector: &Collector, users_url: &str) -> Process {
    start_exporting(dbs, collector, "relay", &["--users-url", users_url, "run"])
}

/// The test's Student DB, to read its outbox.
async fn student_db_of(dbs: &TestDatabases) -> sea_orm::DatabaseConnection {
    platform::db::connect(&dbs.student_url)
        .await
        .expect("Student DB")
}

/// Starts `binary` on the test's databases (a service on port 0), exporting its spans to
/// `collector` with an hour between batches: they arrive when it stops.
fn start_exporting(
    dbs: &TestDatabases,
    collector: &Collector,
    binary: &str,
    args: &[&str],
) -> Process {
    start_exporting_with(dbs, collector, &[], binary, args)
}

/// [`start_exporting`] with the variables `env` too.
fn start_exporting_with(
    dbs: &TestDatabases,
    collector: &Collector,
    env: &[(&str, &str)],
    binary: &str,
    args: &[&str],
) -> Process {
    let endpoint = collector.endpoint();
    let env: Vec<(String, String)> = [
        ("RUST_LOG", "info"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "3600000"),
    ]
    .iter()
    .chain(env)
    .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
    .collect();
    let (url, listen): (&str, &[&str]) = match binary {
        "users-svc" => (&dbs.users_url, &["--listen", "127.0.0.1:0"]),
        "student-svc" => (&dbs.student_url, &["--listen", "127.0.0.1:0"]),
        _ => (&dbs.student_url, &[]),
    };
    let args: Vec<String> = listen
        .iter()
        .chain(&["--database-url", url])
        .chain(args)
        .map(|a| (*a).to_owned())
        .collect();
    let log = dbs.dir.path().join(format!("{binary}.log"));
    Process::spawn_isolated(&binaries().join(binary), &args, &env, &log)
        .unwrap_or_else(|err| panic!("start {binary}: {err:#}"))
}

/// Waits until the service `process` runs serves; its address.
async fn serving(process: &mut Process) -> std::net::SocketAddr {
    let service = match process.name() {
        "users-svc" => "users.v1.UsersService",
        _ => "student.v1.StudentService",
    };
    let addr = process
        .listening_addr(Duration::from_secs(30))
        .expect("listening");
    wait_until_serving(addr, service, Duration::from_secs(30))
        .await
        .expect("serving");
    addr
}

/// Waits until each of the students `ids` is linked to its user.
async fn wait_until_linked<'a>(
    client: &StudentServiceClient<tonic::transport::Channel>,
    ids: impl IntoIterator<Item = &'a String>,
) {
    for id in ids {
        eventually("the student linked", LINK_DEADLINE, || {
            let (mut client, id) = (client.clone(), id.clone());
            async move {
                let student = client
                    .get_student(proto::student::v1::GetStudentRequest { id })
                    .await
                    .ok()?
                    .into_inner();
                (student.user_link_status() == UserLinkStatus::Linked).then_some(())
            }
        })
        .await;
    }
}

/// Creates the student of [`student_request`]`(n)` under a trace of its own, as a sampled
/// caller's; its trace id and the student's id.
async fn create_traced(
    client: &StudentServiceClient<tonic::transport::Channel>,
    n: usize,
) -> (String, String) {
    let trace_id = new_trace_id();
    let id = client
        .clone()
        .create_student(with_trace(student_request(n), &trace_id))
        .await
        .expect("created")
        .into_inner()
        .id;
    (trace_id, id)
}

fn student_client(addr: std::net::SocketAddr) -> StudentServiceClient<tonic::transport::Channel> {
    StudentServiceClient::new(plaintext_channel(addr))
}

fn users_client(addr: std::net::SocketAddr) -> UsersServiceClient<tonic::transport::Channel> {
    UsersServiceClient::new(plaintext_channel(addr))
}

fn plaintext_channel(addr: std::net::SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy()
}

/// Waits until the Student DB's outbox rows (`db`, in id order) are as `ready` wants, and
/// returns them.
async fn outbox_rows_when(
    db: &sea_orm::DatabaseConnection,
    what: &str,
    ready: impl Fn(&[outbox::Model]) -> bool,
) -> Vec<outbox::Model> {
    eventually(what, LINK_DEADLINE, || async {
        let rows = outbox::Entity::find()
            .order_by_asc(outbox::Column::Id)
            .all(db)
            .await
            .expect("outbox rows");
        ready(&rows).then_some(rows)
    })
    .await
}

/// SIGTERM, and a clean exit.
fn stop(process: &mut Process) {
    process.signal(Signal::SIGTERM).expect("SIGTERM");
    let status = process
        .wait_timeout(Duration::from_secs(30))
        .expect("wait")
        .unwrap_or_else(|| panic!("{} stops", process.name()));
    assert!(status.success(), "{}: {status}", process.name());
}

/// The spans of one trace, each checked to end after it starts.
struct Spans(Vec<ReceivedSpan>);

impl Spans {
    /// The `count` spans of `kind` that `service` exported, oldest first.
    fn all(&self, service: &str, kind: SpanKind, count: usize) -> Vec<ReceivedSpan> {
        let mut found: Vec<ReceivedSpan> = self
            .0
            .iter()
            .filter(|received| received.service == service && received.span.kind == kind as i32)
            .cloned()
            .collect();
        assert_eq!(
            found.len(),
            count,
            "{kind:?} spans of {service}: {:#?}",
            self.0
        );
        for received in &found {
            assert!(
                received.span.start_time_unix_nano <= received.span.end_time_unix_nano,
                "{received:#?}"
            );
        }
        found.sort_by_key(|received| received.span.start_time_unix_nano);
        found
    }

    /// The first span of `kind` that `service` exported.
    fn earliest(&self, service: &str, kind: SpanKind) -> ReceivedSpan {
        self.0
            .iter()
            .filter(|received| received.service == service && received.span.kind == kind as i32)
            .min_by_key(|received| received.span.start_time_unix_nano)
            .unwrap_or_else(|| panic!("no {kind:?} span of {service}: {:#?}", self.0))
            .clone()
    }

    fn only(&self, service: &str, kind: SpanKind) -> ReceivedSpan {
        self.all(service, kind, 1).remove(0)
    }
}

/// Asserts that no span carries the e-mail address or document number of any of the
/// `students` (as [`student_request`] makes them), in its name, attributes, links or
/// status: a tracing backend is no place for personal data (README, "Personal data").
fn assert_no_personal_data(spans: &[ReceivedSpan], students: std::ops::Range<usize>) {
    assert!(!spans.is_empty(), "no span to look at");
    for n in students {
        let student = student_request(n);
        for value in [student.email, student.document_number] {
            for span in spans {
                assert!(
                    !format!("{span:?}").contains(&value),
                    "{value} in {span:#?}"
                );
            }
        }
    }
}

fn new_trace_id() -> String {
    format!("{:032x}", Uuid::new_v4().as_u128())
}

/// The JSON log lines of `log` (lines of a text-format run before are skipped) whose
/// top-level `trace_id` is `trace_id`: their messages.
fn json_messages(log: &str, trace_id: &str) -> Vec<String> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["trace_id"] == trace_id)
        .map(|line| line["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn one_trace_id_follows_a_student_through_the_three_processes(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    // Users logs JSON lines, the others text: the trace id is found in both formats.
    stack
        .restart_users_with(None, &["--log-format", "json"])
        .await;
    // Users is down when the student is created, so the journey includes a retry.
    stack.kill_users();
    let (trace_id, id) = create_traced(&stack.student_client(), 0).await;
    eventually(
        "the relay retries under the trace",
        LINK_DEADLINE,
        || async {
            stack
                .relay_log()
                .lines()
                .any(|line| {
                    line.contains(&trace_id) && line.contains("delivery failed, will retry")
                })
                .then_some(())
        },
    )
    .await;
    stack
        .restart_users_with(None, &["--log-format", "json"])
        .await;
    stack.wait_until_all_linked(1).await;

    // A change carries a trace of its own.
    let change_trace_id = new_trace_id();
    let student = stack
        .student_client()
        .get_student(proto::student::v1::GetStudentRequest { id: id.clone() })
        .await
        .expect("found")
        .into_inner();
    stack
        .student_client()
        .update_student(with_trace(
            proto::student::v1::UpdateStudentRequest {
                id: id.clone(),
                first_name: "Renamed".into(),
                last_name: student.last_name,
                email: student.email,
                idempotency_key: None,
                expected_version: student.version,
            },
            &change_trace_id,
        ))
        .await
        .expect("updated");
    stack.wait_until_all_synced(1).await;
    // And the deactivation, under one more.
    let deactivate_trace_id = new_trace_id();
    stack
        .student_client()
        .deactivate_student(with_trace(
            proto::student::v1::DeactivateStudentRequest {
                id: id.clone(),
                idempotency_key: None,
            },
            &deactivate_trace_id,
        ))
        .await
        .expect("deactivated");
    stack.wait_until_all_synced(1).await;
    // A replay is answered from Users' inbox, under the student's trace too.
    let replay = stack.relay_command(&["replay", "--student", &id]);
    assert_eq!(replay.status.code(), Some(0), "{replay:?}");

    // student-svc (text): the call's span names the trace.
    let student_log = stack.log_of("student-svc");
    assert!(
        student_log.contains(&format!("CreateStudent{{trace_id={trace_id}}}")),
        "{student_log}"
    );
    assert!(student_log.contains(&format!("UpdateStudent{{trace_id={change_trace_id}}}")));
    assert!(student_log.contains(&format!(
        "DeactivateStudent{{trace_id={deactivate_trace_id}}}"
    )));
    // relay (text): the failed attempt and the delivery, each line naming the trace.
    let relay_log = stack.wait_for_relay_log_lines(&trace_id, 2).await;
    // README: "every log line about the student carries its trace_id": each line of
    // student-svc and the relay that names the student names one of its three traces.
    let traces = [&trace_id, &change_trace_id, &deactivate_trace_id];
    for (name, log) in [("student-svc", &student_log), ("relay", &relay_log)] {
        let about: Vec<&str> = log.lines().filter(|line| line.contains(&id)).collect();
        assert!(!about.is_empty(), "{name} logs the student");
        for line in about {
            assert!(
                traces.iter().any(|trace| line.contains(trace.as_str())),
                "{name}: a line about the student without its trace: {line}"
            );
        }
    }
    let relay_lines: Vec<&str> = relay_log
        .lines()
        .filter(|line| line.contains(&trace_id))
        .collect();
    assert!(
        relay_lines
            .iter()
            .any(|line| line.contains("delivery failed, will retry")),
        "{relay_log}"
    );
    assert!(
        relay_lines
            .iter()
            .any(|line| line.contains("delivered and linked")),
        "{relay_log}"
    );
    for change in [&change_trace_id, &deactivate_trace_id] {
        eventually("the change's delivery logged", LINK_DEADLINE, || async {
            stack
                .relay_log()
                .lines()
                .any(|line| line.contains(change.as_str()) && line.contains("delivered and synced"))
                .then_some(())
        })
        .await;
    }
    // users-svc (JSON): the creation and the replay carry `trace_id` as a field. Its lines
    // are written by a thread of their own, so the replay's may follow its answer.
    eventually("Users logs the replay", LINK_DEADLINE, || async {
        json_messages(&stack.log_of("users-svc"), &trace_id)
            .iter()
            .any(|message| message == "answered from the inbox")
            .then_some(())
    })
    .await;
    let users_log = stack.log_of("users-svc");
    let messages = json_messages(&users_log, &trace_id);
    assert!(
        messages.iter().any(|m| m == "user created"),
        "{messages:?}\n{users_log}"
    );
    assert!(
        messages.iter().any(|m| m == "answered from the inbox"),
        "{messages:?}"
    );
    for change in [&change_trace_id, &deactivate_trace_id] {
        assert!(!json_messages(&users_log, change).is_empty(), "{users_log}");
    }
    // Each JSON line has the documented keys; the `user created` line, for one, with its
    // event's own field.
    let created = users_log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["trace_id"] == trace_id.as_str() && line["message"] == "user created")
        .expect("the user created line");
    let text = |key: &str| created[key].as_str().unwrap_or_default().to_owned();
    assert!(
        chrono::DateTime::parse_from_rfc3339(&text("timestamp")).is_ok(),
        "{created}"
    );
    assert_eq!(text("level"), "INFO", "{created}");
    assert!(text("target").starts_with("users_svc"), "{created}");
    assert!(!text("span").is_empty(), "{created}");
    assert!(uuid::Uuid::parse_str(&text("user_id")).is_ok(), "{created}");

    // `relay show` names each row's trace, so a trace can be found from a student.
    let show = stack.relay_command(&["show", "--student", &id]);
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(shown.contains(&format!("trace_id {trace_id}\n")), "{shown}");
    for change in [&change_trace_id, &deactivate_trace_id] {
        assert!(shown.contains(&format!("trace_id {change}")), "{shown}");
    }

    // A malformed traceparent is no error: the call starts a trace of its own.
    let mut garbled = tonic::Request::new(student_request(1));
    garbled
        .metadata_mut()
        .insert("traceparent", "garbage".parse().expect("ASCII"));
    let other = stack
        .student_client()
        .create_student(garbled)
        .await
        .expect("created")
        .into_inner()
        .id;
    let rows = stack.outbox_rows().await;
    let stored = rows
        .iter()
        .find(|row| row.aggregate_id.to_string() == other)
        .and_then(|row| row.traceparent.clone())
        .expect("a trace stored");
    let fresh = stored.split('-').nth(1).expect("a trace id");
    // With no collector named, a trace started here is marked sampled, so that a process
    // further on that exports spans exports its hops.
    assert!(stored.ends_with("-01"), "{stored}");
    assert_eq!(fresh.len(), 32);
    assert!(
        fresh
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(fresh, trace_id);
}
