//! The three real binaries as processes: started in an awkward order, killed with SIGKILL,
//! restarted; every student still ends linked exactly once.

use std::time::Duration;

use proto::student::v1::{GetStudentRequest, UserLinkStatus};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use student_svc::entity::outbox;

use crate::{
    on_both_backends,
    support::{
        Backend, eventually,
        invariants::{assert_each_student_linked_exactly_once, users_and_inbox_rows},
        stack::{LINK_DEADLINE, Stack},
    },
};

on_both_backends!(
    three_binaries_link_every_student_and_replay_creates_nothing,
    a_relay_killed_mid_delivery_and_restarted_loses_and_duplicates_nothing,
    users_svc_killed_and_restarted_delays_but_loses_nothing,
    sigterm_stops_every_binary_cleanly,
    a_request_past_the_server_timeout_is_cancelled_and_stores_nothing,
);

async fn three_binaries_link_every_student_and_replay_creates_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..20).await;
    stack.wait_until_all_linked(20).await;
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 20).await;
    let mut client = stack.student_client();
    for id in &ids {
        let student = client
            .get_student(GetStudentRequest { id: id.clone() })
            .await
            .expect("found")
            .into_inner();
        assert_eq!(student.user_link_status(), UserLinkStatus::Linked);
        assert_eq!(
            student.user_id,
            links[&id.parse().expect("uuid")].to_string()
        );
    }

    let replay = stack.relay_command(&["replay", "--all"]);
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(
        replay.status.code(),
        Some(0),
        "replay output:\n{stdout}\n{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 21);
    for (line, row) in lines.iter().zip(stack.outbox_rows().await) {
        let expected = format!(
            "key={} student={} user={} from_inbox=true matches_link=true",
            row.idempotency_key, row.aggregate_id, links[&row.aggregate_id]
        );
        assert_eq!(*line, expected);
    }
    assert_eq!(lines[20], "replayed=20 matched=20 mismatched=0 errors=0");
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (20, 20),
        "replay created nothing"
    );

    let status = stack.relay_command(&["status"]);
    assert_eq!(status.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "pending 0\nprocessing 0\ndone 20\nfailed 0\noldest_pending_age_seconds 0\n"
    );
}

async fn a_relay_killed_mid_delivery_and_restarted_loses_and_duplicates_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    // A backlog far larger than one batch, then a relay killed with SIGKILL right after its
    // first link: it dies holding calls in flight, some answered by Users but not recorded.
    stack.kill_relays();
    let total = 200;
    stack.create_students(0..total).await;
    assert_eq!(stack.linked_students().await, 0, "no relay, no links");
    stack.start_relay(None, &[]);
    while stack.linked_students().await == 0 {
        stack.assert_running();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stack.kill_relays();
    let linked_at_kill = stack.linked_students().await;
    let (users_at_kill, _) = users_and_inbox_rows(&stack.users_db).await;
    assert!(
        linked_at_kill < total as u64,
        "the relay died with work left ({linked_at_kill} of {total} linked)"
    );
    assert!(users_at_kill >= linked_at_kill);
    eprintln!("killed the relay with {linked_at_kill} linked and {users_at_kill} users created");

    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(total as u64).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, total).await;
}

async fn users_svc_killed_and_restarted_delays_but_loses_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..5).await;
    stack.wait_until_all_linked(5).await;

    stack.kill_users();
    stack.create_students(5..15).await;
    // The relay keeps trying: attempts are recorded, rows stay pending, nothing fails.
    eventually(
        "failed attempts recorded while Users is down",
        LINK_DEADLINE,
        || async {
            let retried = outbox::Entity::find()
                .filter(outbox::Column::Attempts.gt(0))
                .count(&stack.student_db)
                .await
                .expect("count");
            (retried > 0).then_some(())
        },
    )
    .await;
    let failed = outbox::Entity::find()
        .filter(outbox::Column::Status.eq(outbox::OutboxStatus::Failed))
        .count(&stack.student_db)
        .await
        .expect("count");
    assert_eq!(failed, 0, "a Users outage fails no row");
    assert_eq!(stack.linked_students().await, 5);

    stack.restart_users(None).await;
    stack.wait_until_all_linked(15).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 15).await;
}

async fn sigterm_stops_every_binary_cleanly(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..3).await;
    stack.wait_until_all_linked(3).await;
    let ended = stack.terminate_all(Duration::from_secs(15));
    let names: Vec<&str> = ended.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["relay", "student-svc", "users-svc"]);
    for (name, status) in ended {
        let status = status.unwrap_or_else(|| panic!("{name} still running 15 s after SIGTERM"));
        assert!(
            status.success(),
            "{name} exited with {status} after SIGTERM"
        );
    }
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 3).await;
}

async fn a_request_past_the_server_timeout_is_cancelled_and_stores_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    let slow = "users-before-commit=sleep(5000)";
    stack
        .restart_users_with(Some(slow), &["--request-timeout", "500ms"])
        .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", stack.users_addr))
        .expect("endpoint")
        .connect_lazy();
    let status = proto::users::v1::users_service_client::UsersServiceClient::new(channel)
        .create_user(proto::users::v1::CreateUserRequest {
            idempotency_key: "slow".into(),
            email: "ana@example.edu".into(),
            first_name: "Ana".into(),
            last_name: "Pérez".into(),
            document_number: "DOC-1".into(),
            student_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .expect_err("the server gives up after its timeout");
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
    // The handler was dropped mid-transaction: rolled back, and it can never commit later.
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (0, 0));
    stack.assert_running();
}
