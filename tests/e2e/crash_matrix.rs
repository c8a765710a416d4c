//! One test per row of the failure table: a real process dies at a named point (SIGABRT
//! from a fail point: no cleanup, no goodbye), is restarted, and every student still ends
//! linked exactly once with nothing left `processing`.

use platform::failpoint::points;
use proto::student::v1::{CreateStudentRequest, GetStudentRequest, UserLinkStatus};
use student_svc::entity::outbox::{FailureKind, OutboxStatus};
use tonic::Code;

use crate::{
    on_both_backends,
    support::{
        Backend, eventually,
        invariants::{
            assert_each_student_linked_exactly_once, students_and_outbox_rows, users_and_inbox_rows,
        },
        stack::{LINK_DEADLINE, Stack},
        student_request,
    },
};

on_both_backends!(
    student_svc_crash_before_commit_stores_nothing_and_the_retry_creates_once,
    rows_committed_while_no_relay_runs_are_delivered_once,
    relay_crash_after_claim_is_recovered_when_the_lease_expires,
    users_crash_before_commit_rolls_back_and_the_retry_creates_once,
    users_crash_after_commit_is_answered_from_the_inbox,
    relay_crash_before_finalize_is_redelivered_and_answered_from_the_inbox,
    a_relay_whose_lease_expired_finishes_late_without_harm,
    users_slower_than_the_deadline_is_retried_and_creates_once,
    a_rejection_fails_after_one_attempt_and_is_redriven_only_with_a_new_key,
);

fn armed(point: &str, action: &str) -> String {
    format!("{point}={action}")
}

async fn student_svc_crash_before_commit_stores_nothing_and_the_retry_creates_once(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_student(Some(&armed(points::STUDENT_BEFORE_COMMIT, "abort")))
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
    assert!(
        matches!(
            lost.code(),
            Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
        ),
        "{lost:?}"
    );
    stack.wait_for_student_abort();
    assert_eq!(
        students_and_outbox_rows(&stack.student_db).await,
        (0, 0),
        "nothing was committed"
    );

    stack.restart_student(None).await;
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
}

async fn users_crash_after_commit_is_answered_from_the_inbox(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_users(Some(&armed(points::USERS_AFTER_COMMIT, "abort")))
        .await;
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
    assert!(
        stack.relay_log().contains("from_inbox=true"),
        "the redelivery was answered from the inbox"
    );
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
    assert!(stack.relay_log().contains("from_inbox=true"));
}

async fn a_relay_whose_lease_expired_finishes_late_without_harm(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Relay A gets Users' answer, then stalls for twice its lease before recording it.
    stack.start_relay(
        Some(&armed(points::RELAY_BEFORE_FINALIZE, "1*sleep(4000)")),
        &[],
    );
    stack.create_students(0..1).await;
    eventually("relay A has Users' answer", LINK_DEADLINE, || async {
        let (users, _) = users_and_inbox_rows(&stack.users_db).await;
        (users == 1).then_some(())
    })
    .await;
    // Relay B claims the row once A's lease runs out, delivers it (the inbox answers) and
    // links it; then A wakes up and records the same answer again.
    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(1).await;
    eventually(
        "both relays recorded their delivery",
        LINK_DEADLINE,
        || async { (stack.relay_log().matches("delivered and linked").count() == 2).then_some(()) },
    )
    .await;
    let log = stack.relay_log();
    assert!(
        log.contains("from_inbox=false") && log.contains("from_inbox=true"),
        "{log}"
    );
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    let row = &stack.outbox_rows().await[0];
    assert_eq!((row.status, row.attempts), (OutboxStatus::Done, 2));
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
    let row = &stack.outbox_rows().await[0];
    assert!(row.attempts >= 2, "the first attempt timed out");
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
    users
        .create_user(crate::support::conflicting_user_request(0))
        .await
        .expect("a user already holds the document number");
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
            "id={} key={} skipped: rejected by Users; the same key gets the same answer, use --new-key\nrequeued=0 skipped=1 errors=0\n",
            failed.id, failed.idempotency_key
        )
    );
    let redriven =
        stack.relay_command(&["retry-failed", "--id", &failed.id.to_string(), "--new-key"]);
    assert_eq!(
        redriven.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&redriven.stdout)
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
}
