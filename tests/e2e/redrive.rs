//! `relay retry-failed` after the worst luck: Users committed a user (or applied a change),
//! its answer was lost, and Users stayed unreachable until the row ran out of attempts.
//! Giving the row a new key then must not strand the student (a new key is rejected: its
//! own user holds the document number), create a second user (if that user was disabled
//! meanwhile) or apply a change twice; the student's later changes then follow in order.

use platform::failpoint::points;
use proto::student::v1::{GetStudentRequest, Student, UserLinkStatus};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, sea_query::Expr};
use student_store::{
    effect::Effect,
    entity::outbox::{self, FailureKind, OutboxStatus},
};
use users_svc::entity::users;
use uuid::Uuid;

use crate::{
    crash_matrix::{
        a_student_with_two_changes_waiting, assert_both_changes_synced, assert_changes_applied_once,
    },
    on_both_backends,
    support::{
        Backend, conflicting_user_request, eventually,
        invariants::{
            assert_each_student_linked_exactly_once, stored_user, the_only_user,
            users_and_inbox_rows,
        },
        stack::{LINK_DEADLINE, Stack},
        user_of_no_student,
    },
};

on_both_backends!(
    an_exhausted_row_whose_user_was_created_is_linked_instead_of_rekeyed,
    an_exhausted_row_whose_user_was_disabled_meanwhile_gets_no_second_user,
    an_exhausted_update_users_applied_is_recorded_as_synced_and_the_next_change_follows,
    an_exhausted_update_requeued_with_its_key_is_applied_once_and_the_next_change_follows,
    an_exhausted_row_whose_key_users_purged_is_linked_to_the_students_only_user,
    an_expired_update_takes_a_new_key_and_the_next_change_follows,
    an_exhausted_update_whose_key_users_purged_takes_a_new_key_at_once,
    with_two_users_of_the_student_the_link_is_never_a_guess,
    an_exhausted_row_first_asked_after_users_kept_keys_longer_is_linked_not_rekeyed,
    a_row_rejected_because_its_students_own_user_holds_the_number_is_linked,
);

/// How long the restarted Users keeps keys ([`users_forgets_every_key`]).
const SHORT_RETENTION: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

/// Restarts Users keeping keys for [`SHORT_RETENTION`], and waits until every key of the
/// test is past its horizon ([`keys_past_users_horizon`]).
async fn users_forgets_every_key(stack: &mut Stack) {
    stack
        .restart_users_with(
            None,
            &["--inbox-retention", "2s", "--inbox-purge-interval", "100ms"],
        )
        .await;
    keys_past_users_horizon(stack).await;
}

/// Waits until Users has purged every key it held and every outbox row's key was issued
/// longer ago than Users keeps keys: a delivery of any of them, or a question about it,
/// is judged by its age.
async fn keys_past_users_horizon(stack: &Stack) {
    eventually("every key past Users' horizon", LINK_DEADLINE, || async {
        let newest = stack
            .outbox_rows()
            .await
            .iter()
            .map(outbox::Model::key_issued_at)
            .max()?;
        (users_and_inbox_rows(&stack.users_db).await.1 == 0
            && newest + SHORT_RETENTION < chrono::Utc::now())
        .then_some(())
    })
    .await;
}

/// The one user in Users (the student's, created by the row's key before its answer was
/// lost).
async fn the_user(stack: &Stack) -> users::Model {
    the_only_user(&stack.users_db).await
}

/// Outbox row `id` as it is now.
async fn the_row(stack: &Stack, id: i64) -> Option<outbox::Model> {
    stack
        .outbox_rows()
        .await
        .into_iter()
        .find(|row| row.id == id)
}

/// Waits until outbox row `id`, under `key`, is failed (it was requeued or sent again),
/// and returns it.
async fn once_failed(stack: &Stack, id: i64, key: &str) -> outbox::Model {
    eventually("the row to fail", LINK_DEADLINE, || async {
        the_row(stack, id)
            .await
            .filter(|row| row.status == OutboxStatus::Failed && row.idempotency_key == key)
    })
    .await
}

/// Runs `relay retry-failed ARGS` and returns its exit code and what it printed.
fn retry_failed_exit(stack: &Stack, args: &[&str]) -> (Option<i32>, String) {
    let output = stack.relay_command(&[&["retry-failed"], args].concat());
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

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
    let user = the_user(stack).await;
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
    let user = the_user(&stack).await;
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
    let user = the_user(stack).await;
    assert_eq!(user.source_version, 2, "Users applied the update");
    (id, failed, user.id)
}

/// `retry-failed --all --new-key` asks Users about the old key first: it was executed, so
/// the row is recorded as synced, not re-keyed (a new key would apply the update twice).
/// `--link-user` is refused for a change row first.
async fn an_exhausted_update_users_applied_is_recorded_as_synced_and_the_next_change_follows(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let (id, failed, user_id) = exhaust_an_update_users_applied(&mut stack).await;
    // `--link-user` links a user to a create-user row only: a change row "linked" to the
    // student's own user would be recorded done with its change never applied (a
    // deactivation lost, its login left working). Refused, nothing changed.
    let (code, stdout) = retry_failed_exit(
        &stack,
        &[
            "--id",
            &failed.id.to_string(),
            "--link-user",
            &user_id.to_string(),
        ],
    );
    assert_eq!(
        (code, stdout),
        (
            Some(2),
            format!(
                "id={} key={} not linked: only a create-user row links a user; a change \
                 takes --new-key\nrequeued=0 linked=0 skipped=0 errors=1\n",
                failed.id, failed.idempotency_key
            )
        )
    );
    assert_eq!(
        stack
            .outbox_rows()
            .await
            .into_iter()
            .find(|row| row.id == failed.id),
        Some(failed.clone())
    );
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

/// The worst luck, and then Users purged the key: asked about the old key, Users can no
/// longer tell "never executed" from "executed and purged" (`DELIVERY_EXPIRED`, not
/// `NOT_IN_INBOX`), so `--new-key` does not give the row a new key, which would be refused
/// for the document number the student's own user holds (or, that user disabled, create a
/// second one), even once the relay itself failed the row as `expired`. Users' list of the
/// student's users tells instead: it holds one, so that one is linked, and the student's
/// update, held back meanwhile, reaches Users. (Asked once Users keeps keys longer, the
/// same key reads `NOT_IN_INBOX`:
/// [`an_exhausted_row_first_asked_after_users_kept_keys_longer_is_linked_not_rekeyed`].)
async fn an_exhausted_row_whose_key_users_purged_is_linked_to_the_students_only_user(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let failed = exhaust_a_row_users_executed(&mut stack).await;
    let student_id = failed.aggregate_id.to_string();
    assert_eq!(stack.rename_student(&student_id, "Renamed").await, 2);
    users_forgets_every_key(&mut stack).await;
    let id = failed.id.to_string();
    let line = format!("id={} key={}", failed.id, failed.idempotency_key);

    // Requeued with its own key (safe), the relay sends it: Users refuses it as expired,
    // and the row fails so. Without --new-key it stays failed, with advice.
    retry_failed(&stack, &["--id", &id]);
    let refused = once_failed(&stack, failed.id, &failed.idempotency_key).await;
    assert_eq!(refused.failure_kind, Some(FailureKind::Expired));
    let (code, stdout) = retry_failed_exit(&stack, &["--id", &id]);
    assert_eq!(
        (code, stdout),
        (
            Some(1),
            format!(
                "{line} skipped: expired; Users no longer keeps keys this old, so it cannot \
                 tell whether this one ran. Use --new-key: it links the student's user if \
                 Users holds one, and gives a new key if it holds none\n\
                 requeued=0 linked=0 skipped=1 errors=0\n"
            )
        )
    );
    let student = student_of(&stack, &failed).await;
    assert_eq!(student.user_link_status(), UserLinkStatus::Failed);
    assert!(
        student.link_error.starts_with("DELIVERY_EXPIRED: "),
        "{}",
        student.link_error
    );
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 0),
        "the one user, and no new key tried"
    );

    // --link-user asks Users first: a user it does not have, or another student's, is
    // refused, nothing written.
    let user = the_user(&stack).await;
    let other_student = conflicting_user_request(1);
    let someone_else = stack
        .users_client()
        .create_user(other_student.clone())
        .await
        .expect("another student's user")
        .into_inner()
        .user_id;
    let unknown = Uuid::now_v7();
    for (user_id, refusal) in [
        (unknown.to_string(), format!("Users has no user {unknown}")),
        (
            someone_else.clone(),
            format!(
                "user={someone_else} belongs to student {}, not {student_id}",
                other_student.student_id
            ),
        ),
    ] {
        let (code, stdout) = retry_failed_exit(&stack, &["--id", &id, "--link-user", &user_id]);
        assert_eq!(
            (code, stdout),
            (
                Some(2),
                format!("{line} not linked: {refusal}\nrequeued=0 linked=0 skipped=0 errors=1\n")
            )
        );
    }
    // One row, named, one ending: --link-user never with --all or --new-key.
    let user_id = user.id.to_string();
    for args in [
        &["--all", "--link-user", &user_id][..],
        &["--id", &id, "--new-key", "--link-user", &user_id],
    ] {
        let (code, stdout) = retry_failed_exit(&stack, args);
        assert_eq!((code, stdout.as_str()), (Some(2), ""), "{args:?}");
    }
    assert_eq!(stack.outbox_rows().await[0].status, OutboxStatus::Failed);

    // Users still refuses to judge the key (DELIVERY_EXPIRED); the student's users tell:
    // one.
    let stdout = retry_failed(&stack, &["--id", &id, "--new-key"]);
    assert_eq!(
        stdout,
        format!(
            "{line} linked user={}: Users holds it as the student's only user; not re-keyed\n\
             requeued=0 linked=1 skipped=0 errors=0\n",
            user.id
        )
    );
    let row = stack.outbox_rows().await.remove(0);
    assert_eq!(
        (row.status, row.idempotency_key.as_str(), row.failure_kind),
        (OutboxStatus::Done, failed.idempotency_key.as_str(), None)
    );
    stack.wait_until_all_synced(1).await;
    let student = student_of(&stack, &failed).await;
    assert_eq!(
        (
            student.user_link_status(),
            student.user_id.as_str(),
            student.synced_version
        ),
        (UserLinkStatus::Linked, user.id.to_string().as_str(), 2)
    );
    let renamed = stored_user(&stack.users_db, user.id).await;
    assert_eq!(
        (renamed.first_name.as_str(), renamed.source_version),
        ("Renamed", 2)
    );
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await.0,
        2,
        "no new user"
    );
    // The other student's user, made by hand here, belongs to no student of this DB.
    stack.assert_audit_finds(
        1,
        &[user_of_no_student(&someone_else, &other_student.student_id)],
    );
    // Only a failed row's student is linked so.
    let (code, stdout) = retry_failed_exit(&stack, &["--id", &id, "--link-user", &user_id]);
    assert_eq!(
        (code, stdout),
        (
            Some(2),
            format!("no failed outbox row has id {id}\nrequeued=0 linked=0 skipped=0 errors=1\n")
        )
    );
}

/// A change whose key Users purged is safe under a new key: Users applies each student
/// version at most once. The update Users applied (its answer lost), requeued with its own
/// key after Users forgot it, fails as `expired`; `retry-failed` says to use `--new-key`,
/// which re-keys it (Users answers `applied=false`), and the deactivation behind it follows.
async fn an_expired_update_takes_a_new_key_and_the_next_change_follows(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let (id, failed, _) = exhaust_an_update_users_applied(&mut stack).await;
    users_forgets_every_key(&mut stack).await;
    retry_failed(&stack, &["--id", &failed.id.to_string()]);
    let expired = once_failed(&stack, failed.id, &failed.idempotency_key).await;
    assert_eq!(expired.failure_kind, Some(FailureKind::Expired));
    let (code, stdout) = retry_failed_exit(&stack, &["--all"]);
    assert_eq!(
        (code, stdout),
        (
            Some(1),
            format!(
                "id={} key={} skipped: expired; Users no longer keeps keys this old, so it \
                 cannot tell whether this one ran. Use --new-key: Users applies each student \
                 version at most once, so a new key cannot apply version {} twice\n\
                 requeued=0 linked=0 skipped=1 errors=0\n",
                failed.id, failed.idempotency_key, failed.aggregate_version
            )
        )
    );
    rekey_and_apply_each_change_once(&mut stack, &failed, &id).await;
}

/// The same update, exhausted and past Users' horizon, given a new key at once: a change
/// needs no check first, whatever became of its old key.
async fn an_exhausted_update_whose_key_users_purged_takes_a_new_key_at_once(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let (id, failed, _) = exhaust_an_update_users_applied(&mut stack).await;
    users_forgets_every_key(&mut stack).await;
    rekey_and_apply_each_change_once(&mut stack, &failed, &id).await;
}

/// `retry-failed --all --new-key` gives the failed update `failed` a new key; then the
/// update and the deactivation behind it reach Users once each, in order, to the one user
/// (checked without a replay or the inbox: Users keeps no key that long).
async fn rekey_and_apply_each_change_once(stack: &mut Stack, failed: &outbox::Model, id: &str) {
    let stdout = retry_failed(stack, &["--all", "--new-key"]);
    assert!(
        stdout.contains(&format!(
            "requeued (new key; was {})",
            failed.idempotency_key
        )) && stdout.ends_with("requeued=1 linked=0 skipped=0 errors=0\n"),
        "{stdout}"
    );
    let student = assert_both_changes_synced(stack, id).await;
    let users = users::Entity::find()
        .all(&stack.users_db)
        .await
        .expect("users");
    assert_eq!(users.len(), 1, "one user");
    assert_eq!(
        (
            users[0].id.to_string(),
            users[0].student_id.to_string(),
            users[0].source_version,
            users[0].enabled
        ),
        (student.user_id, student.id, 3, false)
    );
}

/// A student with two users in Users (users.student_id is not unique: here one created by
/// hand under another key). `--link-user` with the one the row's own key did not create is
/// refused while Users' inbox still says which one the row stands for. Once Users forgot
/// the key (and the first user was disabled), `--new-key` does not guess between the two
/// but lists them, and the operator links the second: the student's update, held back
/// meanwhile, changes that one, the linked user, not the student's first.
async fn with_two_users_of_the_student_the_link_is_never_a_guess(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let failed = exhaust_a_row_users_executed(&mut stack).await;
    let student_id = failed.aggregate_id.to_string();
    assert_eq!(stack.rename_student(&student_id, "Renamed").await, 2);
    let created = the_user(&stack).await;
    let second = stack
        .users_client()
        .create_user(proto::users::v1::CreateUserRequest {
            idempotency_key: "someone-else-s-key".into(),
            email: "second@example.edu".into(),
            first_name: "Second".into(),
            last_name: "User".into(),
            document_number: "DOC-SECOND".into(),
            student_id: student_id.clone(),
        })
        .await
        .expect("a second user of the same student")
        .into_inner()
        .user_id;
    let id = failed.id.to_string();
    let line = format!("id={} key={}", failed.id, failed.idempotency_key);
    let (code, stdout) = retry_failed_exit(&stack, &["--id", &id, "--link-user", &second]);
    assert_eq!(
        (code, stdout),
        (
            Some(2),
            format!(
                "{line} not linked: Users created user={} for this row's key; --new-key links \
                 that one\nrequeued=0 linked=0 skipped=0 errors=1\n",
                created.id
            )
        )
    );
    assert_left_as_it_was(&stack, &failed).await;

    // Users forgot every key, and the first user was disabled: both listed, oldest first.
    users_forgets_every_key(&mut stack).await;
    users::Entity::update_many()
        .col_expr(users::Column::Enabled, Expr::value(false))
        .filter(users::Column::Id.eq(created.id))
        .exec(&stack.users_db)
        .await
        .expect("disable the first user");
    let (code, stdout) = retry_failed_exit(&stack, &["--id", &id, "--new-key"]);
    assert_eq!(
        (code, stdout),
        (
            Some(1),
            format!(
                "{line} skipped: student {student_id} has several users in Users, and nothing \
                 tells which one this row stands for: {} (disabled), {second}. Link one with \
                 --id {id} --link-user USER_ID\n\
                 requeued=0 linked=0 skipped=1 errors=0\n",
                created.id
            )
        )
    );
    assert_left_as_it_was(&stack, &failed).await;

    // The operator links the second. The update waiting behind the row has a key as old
    // as the rest (past the horizon): linking dates it, so it is executed, not refused,
    // and it names the linked user.
    let stdout = retry_failed(&stack, &["--id", &id, "--link-user", &second]);
    assert_eq!(
        stdout,
        format!(
            "{line} linked user={second}: Users holds it for this student; not re-keyed\n\
             requeued=0 linked=1 skipped=0 errors=0\n"
        )
    );
    stack.wait_until_all_synced(1).await;
    let second = Uuid::parse_str(&second).expect("uuid");
    let renamed = stored_user(&stack.users_db, second).await;
    assert_eq!(
        (renamed.first_name.as_str(), renamed.source_version),
        ("Renamed", 2)
    );
    let first = stored_user(&stack.users_db, created.id).await;
    assert_eq!(
        (first.first_name, first.source_version, first.enabled),
        (created.first_name, 1, false),
        "the student's first user is not its linked one: left alone"
    );
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await.0,
        2,
        "no third user"
    );
    // The first user is disabled: no second login, the audit is clean. One created by
    // hand and enabled is reported, until it is disabled, naming it.
    stack.assert_audit_clean(1);
    let mut users_client = stack.users_client();
    let third = users_client
        .create_user(proto::users::v1::CreateUserRequest {
            idempotency_key: "a-third-by-hand".into(),
            email: "third@example.edu".into(),
            first_name: "Third".into(),
            last_name: "User".into(),
            document_number: "DOC-THIRD".into(),
            student_id: student_id.clone(),
        })
        .await
        .expect("a third user of the same student")
        .into_inner()
        .user_id;
    let audit = stack.relay_command(&["audit"]);
    assert_eq!(
        (audit.status.code(), String::from_utf8_lossy(&audit.stdout)),
        (
            Some(1),
            format!(
                "student {student_id}: Users also holds enabled user {third} for it, which it \
                 is not linked to\nchecked=1 problems=1\n"
            )
            .into()
        )
    );
    users_client
        .disable_user(proto::users::v1::DisableUserRequest {
            idempotency_key: "disable-the-third".into(),
            student_id: student_id.clone(),
            source_version: 2,
            user_id: third,
        })
        .await
        .expect("disabled");
    stack.assert_audit_clean(1);

    // A change a relay sent without naming the user (before UpdateUser took one) went to
    // the student's first user; sent again naming the linked one, its key gets that saved
    // answer, and the relay refuses to record it. --new-key sees the old key applied to
    // the wrong user and gives the row a new key, which reaches the linked user.
    stack.kill_relays();
    assert_eq!(stack.rename_student(&student_id, "Again").await, 3);
    let row = stack
        .outbox_rows()
        .await
        .into_iter()
        .find(|row| row.aggregate_version == 3)
        .expect("the second rename's row");
    let Ok(Effect::UpdateUser(payload)) = Effect::decode(&row.effect_type, &row.payload) else {
        panic!("an update-user row");
    };
    let unnamed = users_client
        .update_user(proto::users::v1::UpdateUserRequest {
            idempotency_key: row.idempotency_key.clone(),
            student_id: payload.student_id.to_string(),
            first_name: payload.first_name,
            last_name: payload.last_name,
            email: payload.email,
            source_version: payload.source_version,
            user_id: String::new(),
        })
        .await
        .expect("applied")
        .into_inner();
    assert_eq!(unnamed.user_id, created.id.to_string());
    stack.start_relay(None, &[]);
    let refused = once_failed(&stack, row.id, &row.idempotency_key).await;
    assert_eq!(refused.error_code.as_deref(), Some("LINK_CONFLICT"));
    let stdout = retry_failed(&stack, &["--id", &row.id.to_string(), "--new-key"]);
    let rekeyed = the_row(&stack, row.id).await.expect("the row");
    assert_eq!(
        stdout,
        format!(
            "id={} key={} requeued (new key; was {}): Users answered the old key for user {}, \
             not for the student's linked user {second}\n\
             requeued=1 linked=0 skipped=0 errors=0\n",
            row.id, rekeyed.idempotency_key, row.idempotency_key, created.id
        )
    );
    stack.wait_until_all_synced(1).await;
    let again = stored_user(&stack.users_db, second).await;
    assert_eq!(
        (again.first_name.as_str(), again.source_version),
        ("Again", 3)
    );

    // Deactivating the student disables its linked user, which the relay names in
    // DisableUser as in UpdateUser; the student's first user is left as it was.
    let first = stored_user(&stack.users_db, created.id).await;
    assert_eq!(stack.deactivate_student(&student_id).await, 4);
    stack.wait_until_all_synced(1).await;
    let disabled = stored_user(&stack.users_db, second).await;
    assert_eq!((disabled.enabled, disabled.source_version), (false, 4));
    assert_eq!(
        stored_user(&stack.users_db, created.id).await,
        first,
        "the first user is not the linked one"
    );
}

/// The worst luck, Users purged the key, and then Users was set to keep keys longer (as
/// the DeliveriesExpired alert suggests) before anyone asked: the key is young again for
/// Users, which answers the question `NOT_IN_INBOX`, "never executed", which is not so.
/// The student's user in Users is what tells: it is linked, and no second key is tried.
async fn an_exhausted_row_first_asked_after_users_kept_keys_longer_is_linked_not_rekeyed(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let failed = exhaust_a_row_users_executed(&mut stack).await;
    users_forgets_every_key(&mut stack).await;
    stack
        .restart_users_with(None, &["--inbox-retention", "1h"])
        .await;
    new_key_links_the_only_user(&mut stack, &failed, &failed.idempotency_key).await;
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 0),
        "no second user, and no new key tried"
    );
    stack.assert_audit_clean(1);
}

/// A row given a new key blindly after its first key had created the student's user (as a
/// relay before this check did) is rejected: the student's own user holds the document
/// number. Its saved rejection says nothing was created under that key, yet the student
/// has a user: `--new-key` links it instead of trying a third key, rejected again.
async fn a_row_rejected_because_its_students_own_user_holds_the_number_is_linked(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let failed = exhaust_a_row_users_executed(&mut stack).await;
    let blind = format!("blind-{}", Uuid::now_v7());
    assert!(
        student_store::outbox::redrive(&stack.student_db, &failed, &blind)
            .await
            .expect("re-keyed")
    );
    let rejected = once_failed(&stack, failed.id, &blind).await;
    assert_eq!(
        (rejected.failure_kind, rejected.error_code.as_deref()),
        (Some(FailureKind::Rejected), Some("DOCUMENT_NUMBER_TAKEN"))
    );
    new_key_links_the_only_user(&mut stack, &failed, &blind).await;
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (1, 2),
        "one user; the first key and the rejected one"
    );
    stack.assert_audit_clean(1);
}

/// Runs `retry-failed --id N --new-key` for the failed create-user row `failed` (its key
/// now `key`), and asserts that it links the student's only user in Users, as the student
/// then shows.
async fn new_key_links_the_only_user(stack: &mut Stack, failed: &outbox::Model, key: &str) {
    let user = the_user(stack).await;
    let stdout = retry_failed(stack, &["--id", &failed.id.to_string(), "--new-key"]);
    assert_eq!(
        stdout,
        format!(
            "id={} key={key} linked user={}: Users holds it as the student's only user; not \
             re-keyed\nrequeued=0 linked=1 skipped=0 errors=0\n",
            failed.id, user.id
        )
    );
    stack.wait_until_all_linked(1).await;
    assert_eq!(student_of(stack, failed).await.user_id, user.id.to_string());
}

/// Asserts that the exhausted row `failed` is still failed under its own key, and its
/// student unlinked.
async fn assert_left_as_it_was(stack: &Stack, failed: &outbox::Model) {
    let row = stack.outbox_rows().await.remove(0);
    assert_eq!(
        (row.status, row.failure_kind, row.idempotency_key.as_str()),
        (
            OutboxStatus::Failed,
            Some(FailureKind::Exhausted),
            failed.idempotency_key.as_str()
        )
    );
    assert_eq!(
        student_of(stack, failed).await.user_link_status(),
        UserLinkStatus::Failed
    );
}
