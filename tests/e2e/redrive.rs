//! `relay retry-failed` after the worst luck: Users committed a user, its answer was lost,
//! and Users stayed unreachable until the row ran out of attempts. Giving the row a new key
//! then must not strand the student (a new key is rejected: its own user holds the
//! document number) nor create a second user (if that user was disabled meanwhile).

use platform::failpoint::points;
use proto::student::v1::{GetStudentRequest, Student, UserLinkStatus};
use sea_orm::{EntityTrait, sea_query::Expr};
use student_store::entity::outbox::{self, FailureKind, OutboxStatus};
use users_svc::entity::users;

use crate::{
    on_both_backends,
    support::{
        Backend, eventually,
        invariants::{assert_each_student_linked_exactly_once, users_and_inbox_rows},
        stack::{LINK_DEADLINE, Stack},
    },
};

on_both_backends!(
    an_exhausted_row_whose_user_was_created_is_linked_instead_of_rekeyed,
    an_exhausted_row_whose_user_was_disabled_meanwhile_gets_no_second_user,
);

/// Leaves one student whose row failed `exhausted` although Users created its user.
async fn exhaust_a_row_users_executed(stack: &mut Stack) -> outbox::Model {
    stack.kill_relays();
    stack
        .restart_users(Some(&format!("{}=1*abort", points::USERS_AFTER_COMMIT)))
        .await;
    // Three quick attempts: Users is down for all of them.
    stack.start_relay_for_a_users_crash(&["--max-attempts", "3"]);
    stack.create_students(0..1).await;
    stack.wait_for_users_abort();
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 1),
        "Users committed the user; its answer was lost"
    );
    let failed = eventually("the row to run out of attempts", LINK_DEADLINE, || async {
        let row = stack.outbox_rows().await.remove(0);
        (row.status == OutboxStatus::Failed).then_some(row)
    })
    .await;
    assert_eq!(
        (failed.attempts, failed.failure_kind),
        (3, Some(FailureKind::Exhausted))
    );
    // What the client sees: a fixed sentence, never the transport error kept for operators.
    let student = student_of(stack, &failed).await;
    assert_eq!(
        (student.user_link_status(), student.link_error.as_str()),
        (
            UserLinkStatus::Failed,
            "USERS_UNREACHABLE: the login user could not be created; an operator can redrive it"
        )
    );
    let transport_error = failed.last_error.clone().expect("the relay recorded why");
    assert!(!student.link_error.contains(&transport_error));
    stack.restart_users(None).await;
    failed
}

/// The student of `row`, as a client reads it.
async fn student_of(stack: &Stack, row: &outbox::Model) -> Student {
    stack
        .student_client()
        .get_student(GetStudentRequest {
            id: row.aggregate_id.to_string(),
        })
        .await
        .expect("found")
        .into_inner()
}

/// `retry-failed --all --new-key` links the user the old key created and re-keys nothing.
/// (`disabled_in_users`: someone disabled that user directly in Users, so Users no longer
/// mirrors the active student, which the full invariant would check.)
async fn redrive_links_the_existing_user(
    stack: &Stack,
    failed: &outbox::Model,
    disabled_in_users: bool,
) {
    let user = users::Entity::find()
        .one(&stack.users_db)
        .await
        .expect("users")
        .expect("the user created before the answer was lost");
    let output = stack.relay_command(&["retry-failed", "--all", "--new-key"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout,
        format!(
            "id={} key={} linked user={}: Users had executed this key; not re-keyed\n\
             requeued=0 linked=1 skipped=0 errors=0\n",
            failed.id, failed.idempotency_key, user.id
        )
    );
    let row = stack.outbox_rows().await.remove(0);
    assert_eq!(
        (row.status, row.idempotency_key.as_str(), row.failure_kind),
        (OutboxStatus::Done, failed.idempotency_key.as_str(), None),
        "done under its own key"
    );
    let student = student_of(stack, failed).await;
    assert_eq!(
        (student.user_link_status(), student.user_id),
        (UserLinkStatus::Linked, user.id.to_string())
    );
    if disabled_in_users {
        assert_eq!(
            users_and_inbox_rows(&stack.users_db).await,
            (1, 1),
            "no second user, no second key"
        );
        assert_eq!(row.result, Some(user.id.to_string()));
    } else {
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;
    }
    // The inbox agrees with the link.
    let replay = stack.relay_command(&["replay", "--all"]);
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replay.stdout)
    );
}

async fn an_exhausted_row_whose_user_was_created_is_linked_instead_of_rekeyed(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let failed = exhaust_a_row_users_executed(&mut stack).await;
    redrive_links_the_existing_user(&stack, &failed, false).await;
}

async fn an_exhausted_row_whose_user_was_disabled_meanwhile_gets_no_second_user(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let failed = exhaust_a_row_users_executed(&mut stack).await;
    // Someone disables the user in Users: its document number is free again, so a new key
    // would be executed as a second operation and create a second user.
    users::Entity::update_many()
        .col_expr(users::Column::Enabled, Expr::value(false))
        .exec(&stack.users_db)
        .await
        .expect("disable the user");
    redrive_links_the_existing_user(&stack, &failed, true).await;
    let user = users::Entity::find()
        .one(&stack.users_db)
        .await
        .expect("users")
        .expect("one user");
    assert!(
        !user.enabled,
        "linked as it is: disabling it was Users' decision"
    );
}
