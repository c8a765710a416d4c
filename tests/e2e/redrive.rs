//! `relay retry-failed` after the worst luck: Users committed a user (or applied a change),
//! its answer was lost, and Users stayed unreachable until the row ran out of attempts.
//! Giving the row a new key then must not strand the student (a new key is rejected: its
//! own user holds the document number), create a second user (if that user was disabled
//! meanwhile) or apply a change twice; the student's later changes then follow in order.

use platform::failpoint::points;
use proto::student::v1::{GetStudentRequest, Student, UserLinkStatus};
use sea_orm::{EntityTrait, sea_query::Expr};
use student_store::entity::outbox::{self, FailureKind, OutboxStatus};
use users_svc::entity::users;
use uuid::Uuid;

use crate::{
    crash_matrix::{a_student_with_two_changes_waiting, assert_changes_applied_once},
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
    an_exhausted_update_users_applied_is_recorded_as_synced_and_the_next_change_follows,
    an_exhausted_update_requeued_with_its_key_is_applied_once_and_the_next_change_follows,
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

/// Runs `relay retry-failed ARGS`, asserts it exits 0, and returns what it printed.
fn retry_failed(stack: &Stack, args: &[&str]) -> String {
    let output = stack.relay_command(&[&["retry-failed"], args].concat());
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    stdout
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
    let stdout = retry_failed(stack, &["--all", "--new-key"]);
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

/// The same luck for a change: Users applied a student's update, its answer was lost, and
/// Users stayed down until the row ran out of attempts. The student's deactivation, queued
/// behind the update, waits (`blocked`): changes reach Users in order.
async fn exhaust_an_update_users_applied(stack: &mut Stack) -> (String, outbox::Model, Uuid) {
    let id = a_student_with_two_changes_waiting(stack).await;
    stack
        .restart_users(Some(&format!("{}=1*abort", points::USERS_AFTER_COMMIT)))
        .await;
    stack.start_relay_for_a_users_crash(&["--max-attempts", "3"]);
    stack.wait_for_users_abort();
    let failed =
        eventually(
            "the update to run out of attempts",
            LINK_DEADLINE,
            || async {
                stack.outbox_rows().await.into_iter().find(|row| {
                    row.effect_type == "update-user" && row.status == OutboxStatus::Failed
                })
            },
        )
        .await;
    assert_eq!(
        (failed.attempts, failed.failure_kind),
        (3, Some(FailureKind::Exhausted))
    );
    let status = stack.relay_command(&["status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        stdout.contains("\nfailed 1\n") && stdout.ends_with("\nblocked 1\n"),
        "{stdout}"
    );
    stack.restart_users(None).await;
    let user = users::Entity::find()
        .one(&stack.users_db)
        .await
        .expect("users")
        .expect("the user");
    assert_eq!(user.source_version, 2, "Users applied the update");
    (id, failed, user.id)
}

/// `retry-failed --all --new-key` asks Users about the old key first: it was executed, so
/// the row is recorded as synced, not re-keyed (a new key would apply the update twice).
async fn an_exhausted_update_users_applied_is_recorded_as_synced_and_the_next_change_follows(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let (id, failed, user_id) = exhaust_an_update_users_applied(&mut stack).await;
    let stdout = retry_failed(&stack, &["--all", "--new-key"]);
    assert_eq!(
        stdout,
        format!(
            "id={} key={} synced user={user_id}: Users had executed this key; not re-keyed\n\
             requeued=0 linked=1 skipped=0 errors=0\n",
            failed.id, failed.idempotency_key
        )
    );
    assert_changes_applied_once(&mut stack, &id).await;
}

/// Without `--new-key` the row goes back `pending` under its own key: the relay sends it
/// again and Users answers from its inbox, applying nothing twice.
async fn an_exhausted_update_requeued_with_its_key_is_applied_once_and_the_next_change_follows(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let (id, failed, _) = exhaust_an_update_users_applied(&mut stack).await;
    let stdout = retry_failed(&stack, &["--all"]);
    assert_eq!(
        stdout,
        format!(
            "id={} key={} requeued\nrequeued=1 linked=0 skipped=0 errors=0\n",
            failed.id, failed.idempotency_key
        )
    );
    assert_changes_applied_once(&mut stack, &id).await;
}
