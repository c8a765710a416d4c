//! One test per row of the failure table: a real process dies at a named point (SIGABRT
//! from a fail point: no cleanup, no goodbye), is restarted, and every student still ends
//! linked exactly once with nothing left `processing`.

use platform::failpoint::points;
use proto::student::v1::{CreateStudentRequest, GetStudentRequest, Student, UserLinkStatus};
use sea_orm::EntityTrait;
use student_store::entity::{
    outbox::{self, FailureKind, OutboxStatus},
    students,
};
use tonic::Code;

use crate::{
    on_both_backends,
    support::{
        Backend, eventually,
        invariants::{
            assert_each_student_linked_exactly_once, students_and_outbox_rows, users_and_inbox_rows,
        },
        metrics::{sample, scrape},
        stack::{LINK_DEADLINE, Stack},
        student_request,
    },
};

on_both_backends!(
    student_svc_crash_before_commit_stores_nothing_and_the_retry_creates_once,
    student_svc_crash_inside_an_open_transaction_stores_nothing,
    student_svc_crash_inside_a_group_commit_stores_none_of_the_group,
    student_svc_crash_after_commit_is_answered_by_the_retry_with_its_key,
    student_svc_crash_before_a_change_commits_stores_neither_and_the_retry_applies_once,
    a_create_whose_deadline_passes_while_it_commits_lands_and_its_key_finds_it,
    a_change_whose_deadline_passes_before_its_commit_is_rolled_back,
    a_create_whose_group_commit_panics_fails_alone_and_the_writer_goes_on,
    rows_committed_while_no_relay_runs_are_delivered_once,
    relay_crash_after_claim_is_recovered_when_the_lease_expires,
    users_crash_before_commit_rolls_back_and_the_retry_creates_once,
    users_crash_after_commit_is_answered_from_the_inbox,
    users_crash_inside_a_many_row_call_rolls_back_every_row_and_the_retry_creates_each_once,
    users_crash_after_a_many_row_commit_is_answered_from_the_inbox_for_every_row,
    relay_crash_before_finalize_is_redelivered_and_answered_from_the_inbox,
    relay_crash_inside_a_set_finish_leaves_no_row_done_without_its_link,
    a_relay_whose_lease_expired_finishes_late_without_harm,
    users_slower_than_the_deadline_is_retried_and_creates_once,
    a_rejection_fails_after_one_attempt_and_is_redriven_only_with_a_new_key,
    changes_survive_a_relay_dying_after_users_answered_before_finalize,
    changes_survive_users_dying_after_its_commit,
    a_change_survives_users_dying_inside_its_transaction,
);

fn armed(point: &str, action: &str) -> String {
    format!("{point}={action}")
}

/// What a client gets when the service dies during its call: the connection is gone,
/// whichever code the transport gives that.
fn assert_connection_lost(status: &tonic::Status) {
    assert!(
        matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
        ),
        "{status:?}"
    );
}

async fn student_svc_crash_before_commit_stores_nothing_and_the_retry_creates_once(
    backend: Backend,
) {
    crash_before_commit_then_retry(backend, &[]).await;
}

/// The same crash where the rows are already written, uncommitted, when the process dies:
/// on PostgreSQL CreateStudent is one statement, so this takes the mode that keeps its
/// transaction (`--wake-relays in-transaction`), and the database must roll it back.
async fn student_svc_crash_inside_an_open_transaction_stores_nothing(backend: Backend) {
    let stack = crash_before_commit_then_retry(backend, &["--wake-relays", "in-transaction"]).await;
    // The crash and the retry happened in the mode under test (the stack's first start
    // is the default): student-svc says its mode each time it starts.
    if let Some(stack) = stack {
        let log = stack.log_of("student-svc");
        assert_eq!(log.matches("wake_relays=InTransaction").count(), 2, "{log}");
    }
}

/// A change is one transaction too: student-svc dies with the new version and its
/// `update-user` row written, uncommitted. Neither is stored; the client's retry with its
/// key applies the change once, and Users follows.
async fn student_svc_crash_before_a_change_commits_stores_neither_and_the_retry_applies_once(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let id = stack.create_students(0..1).await.remove(0);
    stack.wait_until_all_linked(1).await;
    stack
        .restart_student(Some(&armed(points::STUDENT_CHANGE_BEFORE_COMMIT, "abort")))
        .await;
    let student = stack
        .student_client()
        .get_student(GetStudentRequest { id: id.clone() })
        .await
        .expect("found")
        .into_inner();
    let rename = proto::student::v1::UpdateStudentRequest {
        id: id.clone(),
        first_name: "Renamed".into(),
        last_name: student.last_name,
        email: student.email,
        idempotency_key: Some("rename-1".into()),
        expected_version: 1,
    };
    let lost = stack
        .student_client()
        .update_student(rename.clone())
        .await
        .expect_err("the service dies mid-call");
    assert_connection_lost(&lost);
    stack.wait_for_student_abort();
    let effects = |rows: Vec<outbox::Model>| {
        rows.into_iter()
            .map(|row| (row.aggregate_version, row.effect_type))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        effects(stack.outbox_rows().await),
        [(1, "create-user".to_owned())],
        "no update-user row without its version"
    );

    stack.restart_student(None).await;
    let renamed = stack
        .student_client()
        .update_student(rename)
        .await
        .expect("the retry applies it")
        .into_inner();
    assert_eq!(
        (renamed.version, renamed.first_name.as_str()),
        (2, "Renamed")
    );
    stack.wait_until_all_synced(1).await;
    assert_eq!(
        effects(stack.outbox_rows().await),
        [(1, "create-user".to_owned()), (2, "update-user".to_owned())]
    );
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
}

/// student-svc (started with `flags`) dies before CreateStudent's commit; nothing is
/// stored, and the client's retry with its key creates and links the student once.
/// Returns the stack for further checks (`None` when the backend is not available).
async fn crash_before_commit_then_retry(backend: Backend, flags: &[&str]) -> Option<Stack> {
    let mut stack = Stack::start(backend).await?;
    stack
        .restart_student_with(Some(&armed(points::STUDENT_BEFORE_COMMIT, "abort")), flags)
        .await;
    let request = CreateStudentRequest {
        idempotency_key: Some("enrol-1".into()),
        ..student_request(1)
    };
    let lost = stack
        .student_client()
        .create_student(request.clone())
        .await
        .expect_err("the service dies mid-call");
    assert_connection_lost(&lost);
    stack.wait_for_student_abort();
    assert_eq!(
        students_and_outbox_rows(&stack.student_db).await,
        (0, 0),
        "nothing was committed"
    );

    stack.restart_student_with(None, flags).await;
    let first = stack
        .student_client()
        .create_student(request.clone())
        .await
        .expect("the retry succeeds")
        .into_inner();
    let again = stack
        .student_client()
        .create_student(request)
        .await
        .expect("same key again")
        .into_inner();
    assert_eq!(again.id, first.id);
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
    Some(stack)
}

/// The server's deadline (`--request-timeout`) passes while the request's write is being
/// committed: the database is slow (a `sleep` fail point in the writer, just before its
/// commit). The caller gets `CANCELLED`, but a deadline cannot recall a commit already
/// under way (the writer's batch may hold other callers' students too): the student lands.
/// So `CANCELLED` means "not known", and the same key then returns that student, created
/// and linked once. (A write still queued when its caller gives up is left out:
/// `platform::group_commit`'s tests.)
async fn a_create_whose_deadline_passes_while_it_commits_lands_and_its_key_finds_it(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let slow_commit = armed(points::STUDENT_BEFORE_COMMIT, "1*sleep(1500)");
    stack
        .restart_student_with(Some(&slow_commit), &["--request-timeout", "500ms"])
        .await;
    let request = CreateStudentRequest {
        idempotency_key: Some("enrol-1".into()),
        ..student_request(1)
    };
    let cancelled = stack
        .student_client()
        .create_student(request.clone())
        .await
        .expect_err("the server gives up after its timeout");
    assert_eq!(cancelled.code(), Code::Cancelled, "{cancelled:?}");
    eventually("the commit under way to land", LINK_DEADLINE, || async {
        (students_and_outbox_rows(&stack.student_db).await == (1, 1)).then_some(())
    })
    .await;
    let stored = students::Entity::find()
        .one(&stack.student_db)
        .await
        .expect("read")
        .expect("the student");

    let retried = stack
        .student_client()
        .create_student(request)
        .await
        .expect("the retry with the same key")
        .into_inner();
    assert_eq!(retried.id, stored.id.to_string());
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (1, 1));
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
}

/// README ("Limits"): a request past `--request-timeout` is cancelled and its open
/// transaction rolled back. An UpdateStudent is held just before its commit (a 4 s `sleep`
/// fail point) past a 2 s deadline: the caller gets `CANCELLED`, and the next change, made
/// at once at the same `expected_version`, is applied as version 2; a change that went on
/// committing would hold the student's row (or SQLite's lock) until its commit and then
/// make the next change a version mismatch.
async fn a_change_whose_deadline_passes_before_its_commit_is_rolled_back(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let id = stack.create_students(1..2).await.remove(0);
    stack.wait_until_all_linked(1).await;
    let slow_change = armed(points::STUDENT_CHANGE_BEFORE_COMMIT, "1*sleep(4000)");
    stack
        .restart_student_with(Some(&slow_change), &["--request-timeout", "2s"])
        .await;
    let rename = |first_name: &str| proto::student::v1::UpdateStudentRequest {
        id: id.clone(),
        first_name: first_name.into(),
        last_name: "Pérez".into(),
        email: "ana.perez.1@example.edu".into(),
        idempotency_key: None,
        expected_version: 1,
    };
    let cancelled = stack
        .student_client()
        .update_student(rename("Slow"))
        .await
        .expect_err("the server gives up after its timeout");
    assert_eq!(cancelled.code(), Code::Cancelled, "{cancelled:?}");
    let next = stack
        .student_client()
        .update_student(rename("Next"))
        .await
        .expect("the next change, at version 1 still")
        .into_inner();
    assert_eq!((next.first_name.as_str(), next.version), ("Next", 2));
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (1, 2));
    stack.wait_until_all_synced(1).await;
}

/// README ("Three guarantees", the group commit): a group whose commit panics (a bug)
/// fails only its own callers, whose retries find whatever it wrote by their client keys,
/// and the writer goes on with the next (on SQLite it is the only one). student-svc's
/// first commit panics (`student-before-commit=1*panic`): its caller gets `INTERNAL` and
/// nothing of it is stored; the next CreateStudent is created, and the first caller's
/// retry with its key creates its student, once.
async fn a_create_whose_group_commit_panics_fails_alone_and_the_writer_goes_on(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_student(Some(&armed(points::STUDENT_BEFORE_COMMIT, "1*panic")))
        .await;
    let first = CreateStudentRequest {
        idempotency_key: Some("enrol-1".into()),
        ..student_request(1)
    };
    let failed = stack
        .student_client()
        .create_student(first.clone())
        .await
        .expect_err("its group panicked");
    assert_eq!(failed.code(), Code::Internal, "{failed:?}");
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (0, 0));
    stack
        .student_client()
        .create_student(student_request(2))
        .await
        .expect("the writer went on");
    stack
        .student_client()
        .create_student(first)
        .await
        .expect("the retry creates its student");
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (2, 2));
    stack.wait_until_all_linked(2).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 2).await;
}

/// CreateStudent's group commit writes the students of waiting requests in one
/// transaction; the process dies just before it commits. Both writers are first held in a
/// slow commit of one student each (a `sleep` fail point, seen in the log), so requests 3
/// to 12 queue and form the group. None of the group exists afterwards (at most the two
/// students written alone do, each with its outbox row), and the callers' retries with
/// their keys create each student exactly once, each linked once.
async fn student_svc_crash_inside_a_group_commit_stores_none_of_the_group(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let points = format!(
        "{};{}",
        armed(points::STUDENT_BEFORE_COMMIT, "2*sleep(3000)"),
        armed(points::STUDENT_BEFORE_GROUP_COMMIT, "abort")
    );
    stack.restart_student(Some(&points)).await;
    let requests: Vec<_> = (1..=12)
        .map(|n| CreateStudentRequest {
            idempotency_key: Some(format!("enrol-{n}")),
            ..student_request(n)
        })
        .collect();
    let send = |request: &CreateStudentRequest| {
        let (mut client, request) = (stack.student_client(), request.clone());
        tokio::spawn(async move { client.create_student(request).await })
    };
    let mut calls = Vec::new();
    for (held, request) in requests[..2].iter().enumerate() {
        calls.push(send(request));
        stack
            .wait_for_log_lines("student-svc", "fail point: sleeping", held + 1)
            .await;
    }
    calls.extend(requests[2..].iter().map(send));
    let mut answered = Vec::new();
    for call in calls {
        if let Ok(answer) = call.await.expect("the call's task") {
            answered.push(answer.into_inner());
        }
    }
    stack.wait_for_student_abort();
    let stored: Vec<String> = students::Entity::find()
        .all(&stack.student_db)
        .await
        .expect("students")
        .into_iter()
        .map(|student| student.document_number)
        .collect();
    let alone = [&requests[0].document_number, &requests[1].document_number];
    assert!(
        stored.iter().all(|document| alone.contains(&document)),
        "nothing of the group was committed: {stored:?}"
    );
    let (students, outbox_rows) = students_and_outbox_rows(&stack.student_db).await;
    assert_eq!(students, outbox_rows, "each student with its outbox row");
    assert!(
        answered.len() <= stored.len(),
        "an answered student is stored"
    );

    stack.restart_student(None).await;
    for request in &requests {
        let student = stack
            .student_client()
            .create_student(request.clone())
            .await
            .expect("the retry succeeds")
            .into_inner();
        if let Some(earlier) = answered
            .iter()
            .find(|earlier| earlier.document_number == request.document_number)
        {
            assert_eq!(
                student.id, earlier.id,
                "an answered student is answered again"
            );
        }
    }
    stack.wait_until_all_linked(12).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 12).await;
    stack.assert_audit_clean(12);
}

async fn student_svc_crash_after_commit_is_answered_by_the_retry_with_its_key(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_student(Some(&armed(points::STUDENT_AFTER_COMMIT, "abort")))
        .await;
    let request = CreateStudentRequest {
        idempotency_key: Some("enrol-1".into()),
        ..student_request(1)
    };
    stack
        .student_client()
        .create_student(request.clone())
        .await
        .expect_err("the service dies after committing, before answering");
    stack.wait_for_student_abort();
    assert_eq!(
        students_and_outbox_rows(&stack.student_db).await,
        (1, 1),
        "committed: the student and its outbox row exist although the client got no answer"
    );
    let committed = stack.outbox_rows().await.remove(0);

    stack.restart_student(None).await;
    let retried = stack
        .student_client()
        .create_student(request)
        .await
        .expect("the retry with the same key is answered")
        .into_inner();
    assert_eq!(
        retried.id,
        committed.aggregate_id.to_string(),
        "the student committed before the crash, not a new one"
    );
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (1, 1));
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
}

async fn rows_committed_while_no_relay_runs_are_delivered_once(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..10).await;
    assert_eq!(stack.linked_students().await, 0);
    assert!(
        stack
            .outbox_rows()
            .await
            .iter()
            .all(|row| row.status == OutboxStatus::Pending)
    );
    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(10).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 10).await;
    stack.assert_audit_clean(10);
}

async fn relay_crash_after_claim_is_recovered_when_the_lease_expires(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..5).await;
    stack.start_relay(Some(&armed(points::RELAY_AFTER_CLAIM, "abort")), &[]);
    stack.wait_for_relay_abort(0);
    let rows = stack.outbox_rows().await;
    assert!(rows.iter().all(|row| row.status == OutboxStatus::Processing
        && row.attempts == 1
        && row.locked_until.is_some()));
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (0, 0),
        "Users was never called"
    );

    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(5).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 5).await;
    stack.assert_audit_clean(5);
    assert!(
        stack
            .outbox_rows()
            .await
            .iter()
            .all(|row| row.attempts == 2),
        "claimed again after the lease"
    );
}

async fn users_crash_before_commit_rolls_back_and_the_retry_creates_once(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_users(Some(&armed(points::USERS_BEFORE_COMMIT, "abort")))
        .await;
    stack.start_relay_for_a_users_crash(&[]);
    stack.create_students(0..1).await;
    stack.wait_for_users_abort();
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (0, 0),
        "rolled back"
    );

    stack.restart_users(None).await;
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
    let attempts = stack.outbox_rows().await[0].attempts;
    assert!(
        attempts >= 2,
        "the call Users died in was sent again: {attempts}"
    );
}

async fn users_crash_after_commit_is_answered_from_the_inbox(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_users(Some(&armed(points::USERS_AFTER_COMMIT, "abort")))
        .await;
    stack.start_relay_for_a_users_crash(&[]);
    stack.create_students(0..1).await;
    stack.wait_for_users_abort();
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 1),
        "committed, answer lost"
    );
    assert_eq!(stack.linked_students().await, 0);

    stack.restart_users(None).await;
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
    // The redelivery was answered from the inbox.
    stack
        .wait_for_relay_log_lines("delivered and linked", 1)
        .await;
    let delivered: Vec<String> = delivered_lines(&stack.relay_log());
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert!(delivered[0].contains("from_inbox=true"), "{delivered:?}");
}

/// Four rows waiting when the relay starts go to Users in one CreateUsers call (one
/// transaction); Users dies inside it: none of the four exists, and each is created once
/// after Users is back.
async fn users_crash_inside_a_many_row_call_rolls_back_every_row_and_the_retry_creates_each_once(
    backend: Backend,
) {
    let Some(mut stack) =
        four_rows_in_one_call_to_users_dying_at(backend, points::USERS_BEFORE_COMMIT).await
    else {
        return;
    };
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (0, 0),
        "rolled back, all four"
    );

    stack.restart_users(None).await;
    stack.wait_until_all_linked(4).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
    stack.assert_audit_clean(4);
}

/// Users commits a four-row call and dies before answering: all four users exist, no
/// student is linked; after Users is back every row is answered from the inbox.
async fn users_crash_after_a_many_row_commit_is_answered_from_the_inbox_for_every_row(
    backend: Backend,
) {
    let Some(mut stack) =
        four_rows_in_one_call_to_users_dying_at(backend, points::USERS_AFTER_COMMIT).await
    else {
        return;
    };
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (4, 4),
        "committed together, answers lost"
    );
    assert_eq!(stack.linked_students().await, 0);

    stack.restart_users(None).await;
    stack.wait_until_all_linked(4).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
    stack.assert_audit_clean(4);
    let log = stack
        .wait_for_relay_log_lines("delivered and linked", 4)
        .await;
    let delivered = delivered_lines(&log);
    assert_eq!(delivered.len(), 4, "{log}");
    assert!(
        delivered
            .iter()
            .all(|line| line.contains("from_inbox=true")),
        "{log}"
    );
}

/// Four students written while no relay runs, then a relay that sends them in one
/// CreateUsers call to a Users armed to die at `point`; returns once Users has died.
async fn four_rows_in_one_call_to_users_dying_at(backend: Backend, point: &str) -> Option<Stack> {
    let mut stack = Stack::start(backend).await?;
    stack.kill_relays();
    stack.create_students(0..4).await;
    // Each call also waits 200 ms on arrival (its line logged well before the abort): one
    // line shows the four rows went in one call, not four.
    let slow_arrival = format!("{}=sleep(200)", points::USERS_ON_REQUEST);
    stack
        .restart_users(Some(&format!("{slow_arrival};{}", armed(point, "abort"))))
        .await;
    stack.start_relay_for_a_users_crash(&["--rows-per-call", "4"]);
    stack.wait_for_users_abort();
    let users_log = stack.log_of("users-svc");
    assert_eq!(
        users_log.matches("fail point: sleeping").count(),
        1,
        "one call: {users_log}"
    );
    Some(stack)
}

/// The relays' "delivered and linked" lines, in the order they were logged.
fn delivered_lines(log: &str) -> Vec<String> {
    let mut lines: Vec<String> = log
        .lines()
        .filter(|line| line.contains("delivered and linked"))
        .map(str::to_owned)
        .collect();
    // Each line starts with its RFC 3339 UTC timestamp: sorting the text sorts by time.
    lines.sort();
    lines
}

async fn relay_crash_before_finalize_is_redelivered_and_answered_from_the_inbox(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..3).await;
    stack.start_relay(Some(&armed(points::RELAY_BEFORE_FINALIZE, "abort")), &[]);
    stack.wait_for_relay_abort(0);
    let (users, _) = users_and_inbox_rows(&stack.users_db).await;
    assert!(users >= 1, "Users answered before the relay died");
    assert_eq!(stack.linked_students().await, 0);

    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(3).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 3).await;
    stack.assert_audit_clean(3);
    // Every row Users had answered before the crash was answered again from its inbox.
    let log = stack
        .wait_for_relay_log_lines("delivered and linked", 3)
        .await;
    let delivered = delivered_lines(&log);
    let from_inbox = delivered
        .iter()
        .filter(|line| line.contains("from_inbox=true"))
        .count();
    assert_eq!(delivered.len(), 3, "{log}");
    assert!(from_inbox as u64 >= users, "{users} users existed: {log}");
}

/// README ("Finalize, fenced"; `finish_many.rs`): on SQLite a batch of answers is recorded
/// in two statements, rows `done` then students linked, in one transaction. The relay dies
/// between the two (`relay-between-finish-statements`): no row is `done` and no student
/// linked, and a new relay delivers every row again, answered from the inbox, each student
/// linked once. On PostgreSQL the batch is one statement, the point is never reached, and
/// the same relay links them all.
async fn relay_crash_inside_a_set_finish_leaves_no_row_done_without_its_link(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..8).await;
    stack.start_relay(
        Some(&armed(points::RELAY_BETWEEN_FINISH_STATEMENTS, "abort")),
        &[],
    );
    if backend == Backend::Sqlite {
        stack.wait_for_relay_abort(0);
        let (users, _) = users_and_inbox_rows(&stack.users_db).await;
        assert!(users >= 2, "Users answered a batch before the relay died");
        // A row recorded alone before the batch died may be done, its student linked with
        // it; none is done without its link, nor linked without being done.
        let done: std::collections::BTreeSet<uuid::Uuid> = stack
            .outbox_rows()
            .await
            .iter()
            .filter(|row| row.status == OutboxStatus::Done)
            .map(|row| row.aggregate_id)
            .collect();
        let linked: std::collections::BTreeSet<uuid::Uuid> = students::Entity::find()
            .all(&stack.student_db)
            .await
            .expect("students")
            .iter()
            .filter(|student| student.user_id.is_some())
            .map(|student| student.id)
            .collect();
        assert_eq!(done, linked);
        assert!(done.len() < 8, "the batch that died recorded nothing");
        stack.start_relay(None, &[]);
    }
    stack.wait_until_all_linked(8).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 8).await;
    stack.assert_audit_clean(8);
}

async fn a_relay_whose_lease_expired_finishes_late_without_harm(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Relay A (relay-1) gets Users' answer, then stalls for twice its lease before
    // recording it.
    const METRICS: [&str; 2] = ["--metrics-addr", "127.0.0.1:0"];
    stack.start_relay(
        Some(&armed(points::RELAY_BEFORE_FINALIZE, "1*sleep(4000)")),
        &METRICS,
    );
    stack.create_students(0..1).await;
    eventually("relay A has Users' answer", LINK_DEADLINE, || async {
        let (users, _) = users_and_inbox_rows(&stack.users_db).await;
        (users == 1).then_some(())
    })
    .await;
    // Once A's lease runs out the row is claimed again, by relay B (relay-2) or by A's own
    // loop (a claim whose lease ran out is anyone's), delivered (the inbox answers) and
    // linked. Then A's first delivery wakes up: its claim is gone (the row's attempts moved
    // on), so its finalize loses and changes nothing.
    stack.start_relay(None, &METRICS);
    stack.wait_until_all_linked(1).await;
    let linked = stack.outbox_rows().await.remove(0);
    let relay_a = stack
        .wait_for_log_lines("relay-1", "late finalize lost", 1)
        .await;
    let relays = stack
        .wait_for_relay_log_lines("delivered and linked", 1)
        .await;
    let finalized: Vec<&str> = relays
        .lines()
        .filter(|line| line.contains("delivered and linked"))
        .collect();
    assert_eq!(finalized.len(), 1, "one delivery recorded:\n{relays}");
    let lost_a = first_line_with(&relay_a, "late finalize lost");
    assert!(finalized[0].contains("from_inbox=true"), "{}", finalized[0]);
    assert!(
        finalized[0] < lost_a.as_str(),
        "the second claim finalized first, then A's late finalize lost:\n{}\n{lost_a}",
        finalized[0]
    );
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
    let row = stack.outbox_rows().await.remove(0);
    assert_eq!(row, linked, "A's late finalize changed nothing");
    assert_eq!((row.status, row.attempts), (OutboxStatus::Done, 2));

    // And the relays' metrics say so: A's late finalize counted as superseded (just after
    // its log line), one row replayed by whichever relay sent it again, none linked afresh.
    let (a_addr, b_addr) = (
        stack.metrics_addr("relay-1").await,
        stack.metrics_addr("relay-2").await,
    );
    let deliveries = |scrape: &str, outcome| {
        let labels = [("effect", "create-user"), ("outcome", outcome)];
        sample(scrape, "relay_deliveries_total", &labels)
    };
    let a = eventually("A's superseded delivery counted", LINK_DEADLINE, || async {
        let a = scrape(a_addr).await;
        (deliveries(&a, "superseded") > 0.0).then_some(a)
    })
    .await;
    let b = scrape(b_addr).await;
    let both = |outcome| deliveries(&a, outcome) + deliveries(&b, outcome);
    assert_eq!(
        (both("linked"), both("replayed"), both("superseded")),
        (0.0, 1.0, 1.0),
        "{a}\n{b}"
    );
    assert_eq!(deliveries(&a, "superseded"), 1.0, "{a}");
}

/// The first line of `log` containing `needle` (lines start with their UTC timestamp, so
/// two such lines compare by time).
fn first_line_with(log: &str, needle: &str) -> String {
    log.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{log}"))
        .to_owned()
}

async fn users_slower_than_the_deadline_is_retried_and_creates_once(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    // The first execution takes longer than the relay's 1 s deadline. Users gives up on it
    // too (the deadline travels as grpc-timeout), so it never commits; the retry creates.
    stack
        .restart_users(Some(&armed(points::USERS_BEFORE_COMMIT, "1*sleep(1500)")))
        .await;
    stack.create_students(0..1).await;
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    stack.assert_audit_clean(1);
    let row = &stack.outbox_rows().await[0];
    assert_eq!(
        row.attempts, 2,
        "the first attempt timed out, the second linked"
    );

    // Had Users finished the first execution after the relay stopped waiting, the retry
    // would have been answered from the inbox. It was not: the first execution was
    // abandoned, the second one created the user.
    let relay = stack
        .wait_for_relay_log_lines("delivered and linked", 1)
        .await;
    let timed_out = first_line_with(&relay, "delivery failed, will retry");
    let delivered = delivered_lines(&relay);
    assert_eq!(delivered.len(), 1, "{relay}");
    assert!(
        delivered[0].contains("from_inbox=false"),
        "{}",
        delivered[0]
    );
    assert!(timed_out < delivered[0], "the timeout came first:\n{relay}");
    let users = stack
        .wait_for_log_lines("users-svc", "user created", 1)
        .await;
    assert_eq!(users.matches("user created").count(), 1, "{users}");
    assert_eq!(
        users.matches("answered from the inbox").count(),
        0,
        "{users}"
    );
}

async fn a_rejection_fails_after_one_attempt_and_is_redriven_only_with_a_new_key(backend: Backend) {
    let Some(stack) = Stack::start(backend).await else {
        return;
    };
    let mut users = proto::users::v1::users_service_client::UsersServiceClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", stack.users_addr))
            .expect("endpoint")
            .connect_lazy(),
    );
    let holder_request = crate::support::conflicting_user_request(0);
    let holder = users
        .create_user(holder_request.clone())
        .await
        .expect("a user already holds the document number")
        .into_inner()
        .user_id;
    let id = stack.create_students(0..1).await.remove(0);
    let failed = eventually("the row fails", LINK_DEADLINE, || async {
        let row = stack.outbox_rows().await.remove(0);
        (row.status == OutboxStatus::Failed).then_some(row)
    })
    .await;
    assert_eq!(
        (failed.attempts, failed.failure_kind),
        (1, Some(FailureKind::Rejected)),
        "no retry storm"
    );
    let student = stack
        .student_client()
        .get_student(GetStudentRequest { id })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(student.user_link_status(), UserLinkStatus::Failed);
    assert_eq!(
        student.link_error,
        "DOCUMENT_NUMBER_TAKEN: document_number is already used by another enabled user"
    );

    let refused = stack.relay_command(&["retry-failed", "--all"]);
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&refused.stdout),
        format!(
            "id={} key={} skipped: rejected; the same key gets the same answer, use --new-key\nrequeued=0 linked=0 skipped=1 errors=0\n",
            failed.id, failed.idempotency_key
        )
    );
    let redriven =
        stack.relay_command(&["retry-failed", "--id", &failed.id.to_string(), "--new-key"]);
    let stdout = String::from_utf8_lossy(&redriven.stdout);
    assert_eq!(redriven.status.code(), Some(0), "{stdout}");
    let rekeyed = stack.outbox_rows().await.remove(0);
    assert_eq!(
        stdout,
        format!(
            "id={} key={} requeued (new key; was {}): Users holds no user of student {}\n\
             requeued=1 linked=0 skipped=0 errors=0\n",
            failed.id, rekeyed.idempotency_key, failed.idempotency_key, failed.aggregate_id
        )
    );
    // A new key is a new operation: Users judges it afresh and, the conflict still being
    // there, rejects it again, once.
    let again = eventually("the redriven row is judged", LINK_DEADLINE, || async {
        let row = stack.outbox_rows().await.remove(0);
        (row.status == OutboxStatus::Failed && row.idempotency_key != failed.idempotency_key)
            .then_some(row)
    })
    .await;
    assert_eq!(again.attempts, 1);
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 3),
        "one user; three keys judged"
    );
    // A failed, unlinked student is not a disagreement between the databases; the user
    // holding its number, of a student this Student DB does not have, is.
    stack.assert_audit_finds(
        1,
        &[crate::support::user_of_no_student(
            &holder,
            &holder_request.student_id,
        )],
    );
}

/// A linked student, then (no relay running) an update and a deactivation: two rows waiting,
/// in order.
pub(crate) async fn a_student_with_two_changes_waiting(stack: &mut Stack) -> String {
    let id = stack.create_students(0..1).await.remove(0);
    stack.wait_until_all_linked(1).await;
    stack.kill_relays();
    assert_eq!(stack.rename_student(&id, "Renamed").await, 2);
    assert_eq!(stack.deactivate_student(&id).await, 3);
    id
}

/// The student `id`'s rename and deactivation (versions 2 and 3) are synced, the relays
/// stopped, and the audit finds the databases agreeing; returns the student.
pub(crate) async fn assert_both_changes_synced(stack: &mut Stack, id: &str) -> Student {
    stack.wait_until_all_synced(1).await;
    stack.stop_relays(std::time::Duration::from_secs(15));
    stack.assert_audit_clean(1);
    let student = stack
        .student_client()
        .get_student(GetStudentRequest { id: id.to_owned() })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(
        (student.version, student.synced_version, student.active),
        (3, 3, false)
    );
    student
}

/// Every change reached Users once, in order, and `relay replay` agrees for each effect.
pub(crate) async fn assert_changes_applied_once(stack: &mut Stack, id: &str) {
    assert_both_changes_synced(stack, id).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    let replay = stack.relay_command(&["replay", "--all"]);
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(0), "{stdout}");
    let effects: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    assert_eq!(
        effects,
        [
            "effect=create-user",
            "effect=update-user",
            "effect=disable-user",
            "matched=3"
        ]
    );
}

async fn changes_survive_a_relay_dying_after_users_answered_before_finalize(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let id = a_student_with_two_changes_waiting(&mut stack).await;
    // Users applies the update; the relay dies before recording it.
    stack.start_relay(Some(&armed(points::RELAY_BEFORE_FINALIZE, "abort")), &[]);
    let relay = stack.relays.len() - 1;
    stack.wait_for_relay_abort(relay);
    let row = stack.outbox_rows().await.remove(1);
    assert_eq!(
        (row.effect_type.as_str(), row.status),
        ("update-user", OutboxStatus::Processing)
    );
    // The next relay redelivers it (Users answers from its inbox), then the deactivation.
    stack.start_relay(None, &[]);
    assert_changes_applied_once(&mut stack, &id).await;
    let log = stack.relay_log();
    let update = first_line_with(&log, "effect=\"update-user\"");
    assert!(update.contains("from_inbox=true"), "{update}");
}

async fn changes_survive_users_dying_after_its_commit(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let id = a_student_with_two_changes_waiting(&mut stack).await;
    // Users commits the update, then dies before answering; then the same for the
    // deactivation.
    for effect in ["update-user", "disable-user"] {
        stack
            .restart_users(Some(&armed(points::USERS_AFTER_COMMIT, "1*abort")))
            .await;
        if stack.relays.is_empty() {
            stack.start_relay_for_a_users_crash(&[]);
        }
        stack.wait_for_users_abort();
        let executed = stack
            .outbox_rows()
            .await
            .into_iter()
            .find(|row| row.effect_type == effect)
            .expect("the row");
        assert_ne!(executed.status, OutboxStatus::Done, "{effect}: answer lost");
    }
    stack.restart_users(None).await;
    assert_changes_applied_once(&mut stack, &id).await;
}

/// Users dies with the update written and not committed: the database rolls it back (the
/// user stays at its first version, no inbox row for the update), and the redelivery
/// applies it once. UpdateUser keeps its transaction on both backends, so on PostgreSQL
/// too this is a rollback (CreateUser is one statement there; see the fail point's doc).
async fn a_change_survives_users_dying_inside_its_transaction(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let id = a_student_with_two_changes_waiting(&mut stack).await;
    stack
        .restart_users(Some(&armed(points::USERS_BEFORE_COMMIT, "1*abort")))
        .await;
    stack.start_relay_for_a_users_crash(&[]);
    stack.wait_for_users_abort();
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 1),
        "only the creation is committed"
    );
    let user = users_svc::entity::users::Entity::find()
        .one(&stack.users_db)
        .await
        .expect("read")
        .expect("the user");
    assert_eq!(user.source_version, 1, "the update was rolled back");
    stack.restart_users(None).await;
    assert_changes_applied_once(&mut stack, &id).await;
}
