//! The relay's delivery step, driven directly against in-process services.

use std::{sync::atomic::Ordering, time::Duration};

use proto::{
    student::v1::{GetStudentRequest, UserLinkStatus},
    users::v1::CreateUserRequest,
};
use relay::{BatchOutcome, replay};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, sea_query::Expr,
};
use student_store::effect::{CreateUserPayload, Effect};
use student_store::entity::{
    outbox::{self, FailureKind, OutboxStatus},
    students,
};
use tonic::Code;
use users_svc::entity::users;
use uuid::Uuid;

use crate::{
    on_both_backends,
    support::{
        Backend, TestApp,
        invariants::{
            assert_each_student_linked_exactly_once, assert_linked_at_first_attempt, stored_user,
            the_only_user, users_and_inbox_rows,
        },
        scripted_users::{Script, scripted_users},
        spawn_app, student_request,
    },
};

on_both_backends!(
    one_batch_links_every_pending_student,
    status_counts_as_blocked_only_the_rows_behind_a_failed_row_of_their_student,
    a_student_linked_to_another_user_fails_its_row_as_a_link_conflict,
    a_missing_student_fails_its_row_and_holds_back_no_one,
    a_change_of_a_student_linked_to_no_user_is_not_sent,
    a_change_whose_student_lost_its_link_while_it_was_sent_fails_as_not_linked,
    a_change_for_a_user_users_lost_fails_at_once,
    a_name_saved_before_students_stricter_rule_still_reaches_users,
    a_users_without_list_users_is_named_by_retry_failed_and_audit_and_nothing_changes,
    retry_failed_asks_again_when_users_sheds_its_question,
    undecodable_rows_fail_on_their_own_and_hold_back_no_one,
    a_redelivery_after_a_lost_answer_is_answered_from_the_inbox,
    users_down_keeps_rows_pending_with_backoff,
    retry_delays_double_up_to_the_cap_spread_by_jitter,
    a_rejection_fails_the_row_and_shows_on_the_student,
    replay_answers_from_the_inbox_and_creates_nothing,
    status_counts_rows_per_status,
    a_users_without_create_users_gets_one_call_per_row,
    a_call_refused_whole_as_invalid_sends_its_rows_one_call_each,
    a_shed_call_is_sent_again_after_the_wait_users_asks_for,
    shed_calls_come_back_spread_over_one_to_two_times_the_wait,
    a_stopping_relay_sends_no_shed_call_again_and_hands_its_row_back,
    a_stopping_relay_whose_create_users_call_is_refused_whole_starts_no_call_for_its_rows,
    a_lone_create_user_row_beside_a_change_goes_as_create_user,
    rows_too_large_for_one_call_go_one_call_each,
);

async fn create_students(app: &TestApp, count: usize) -> Vec<String> {
    create_students_from(app, 0..count).await
}

async fn create_students_from(app: &TestApp, numbers: std::ops::Range<usize>) -> Vec<String> {
    let mut ids = Vec::new();
    for n in numbers {
        let student = app
            .student
            .clone()
            .create_student(student_request(n))
            .await
            .expect("created");
        ids.push(student.into_inner().id);
    }
    ids
}

async fn only_row(app: &TestApp) -> outbox::Model {
    let mut rows = outbox::Entity::find()
        .all(&app.student_db)
        .await
        .expect("outbox");
    assert_eq!(rows.len(), 1);
    rows.remove(0)
}

async fn one_batch_links_every_pending_student(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let ids = create_students(&app, 5).await;
    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(
        outcome,
        BatchOutcome {
            claimed: 5,
            delivered: 5,
            retried: 0,
            failed: 0,
            released: 0,
            superseded: 0,
        }
    );
    let links = assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 5).await;

    for id in ids {
        let student = app
            .student
            .clone()
            .get_student(GetStudentRequest { id: id.clone() })
            .await
            .expect("found")
            .into_inner();
        assert_eq!(student.user_link_status(), UserLinkStatus::Linked);
        assert_eq!(
            student.user_id,
            links[&Uuid::parse_str(&id).expect("uuid")].to_string()
        );
    }
    // Nothing left: a second batch finds no work and changes nothing.
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch"),
        BatchOutcome::default()
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (5, 5));
}

/// A relay running its loop (polling only) on a task of its own, until told to stop.
struct RunningRelay {
    task: tokio::task::JoinHandle<()>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl RunningRelay {
    fn start(relay: relay::Relay) -> Self {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                relay
                    .run(relay::wakeup::Wakeup::poll_only(), shutdown)
                    .await
            }
        });
        Self { task, shutdown }
    }

    /// As SIGTERM tells `relay run`.
    fn tell_to_stop(&self) {
        self.shutdown.cancel();
    }

    /// Once the relay has stopped (30 s at most).
    async fn stopped(self) {
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the relay stops")
            .expect("relay task");
    }
}

/// Statuses of the outbox rows, oldest first.
async fn statuses(app: &TestApp) -> Vec<outbox::Model> {
    outbox::Entity::find()
        .order_by_asc(outbox::Column::Id)
        .all(&app.student_db)
        .await
        .expect("outbox")
}

async fn a_student_linked_to_another_user_fails_its_row_as_a_link_conflict(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let ids = create_students(&app, 2).await;
    // Student 0 shows a user nobody delivered (a manual fix gone wrong, say).
    let foreign = Uuid::now_v7();
    let first = Uuid::parse_str(&ids[0]).expect("uuid");
    students::Entity::update_many()
        .col_expr(students::Column::UserId, Expr::value(foreign))
        .filter(students::Column::Id.eq(first))
        .exec(&app.student_db)
        .await
        .expect("link by hand");

    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(
        (outcome.claimed, outcome.delivered, outcome.failed),
        (2, 1, 1)
    );
    let rows = statuses(&app).await;
    assert_eq!(
        (rows[0].status, rows[1].status),
        (OutboxStatus::Failed, OutboxStatus::Done)
    );
    let created = users::Entity::find()
        .filter(users::Column::StudentId.eq(first))
        .one(&app.users_db)
        .await
        .expect("users")
        .expect("Users created the user before the link was refused");
    let message = format!(
        "student {first} is already linked to user {foreign}, not {}",
        created.id
    );
    assert_eq!(
        (rows[0].error_code.as_deref(), rows[0].last_error.as_deref()),
        (Some("LINK_CONFLICT"), Some(message.as_str()))
    );
    let expected = format!("LINK_CONFLICT: {message}");
    let student = app
        .student
        .clone()
        .get_student(GetStudentRequest { id: ids[0].clone() })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(
        (
            student.user_link_status(),
            student.user_id,
            student.link_error
        ),
        (UserLinkStatus::Failed, foreign.to_string(), expected),
        "the existing link is never overwritten"
    );
    // A new key would make Users create a second user for this student: refused.
    let (summary, out) = retry_every_failed_row_with_a_new_key(&app, &app.relay().users).await;
    assert_eq!(summary.exit_code(), 2);
    assert_eq!(
        out,
        format!(
            "id={} key={} not linked: Users had executed this key (user={}), but student {first} is already linked to user {foreign}, not {}\nrequeued=0 linked=0 skipped=0 errors=1\n",
            rows[0].id, rows[0].idempotency_key, created.id, created.id
        )
    );
    assert_eq!(statuses(&app).await[0], rows[0], "left as it was");
}

/// Runs `retry-failed --all --new-key` through `users`: its summary, and what it printed.
async fn retry_every_failed_row_with_a_new_key(
    app: &TestApp,
    users: &relay::users_client::UsersClient,
) -> (relay::retry_failed::RetrySummary, String) {
    let mut out = Vec::new();
    let summary = relay::retry_failed::retry_failed(
        &app.student_db,
        users,
        relay::retry_failed::Selection::All,
        relay::retry_failed::Keys::New,
        &mut out,
    )
    .await
    .expect("retry-failed");
    (summary, String::from_utf8(out).expect("utf-8"))
}

async fn a_missing_student_fails_its_row_and_holds_back_no_one(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let ids = create_students(&app, 2).await;
    let gone = Uuid::parse_str(&ids[0]).expect("uuid");
    students::Entity::delete_by_id(gone)
        .exec(&app.student_db)
        .await
        .expect("delete the student");

    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(
        (outcome.claimed, outcome.delivered, outcome.failed),
        (2, 1, 1)
    );
    let rows = statuses(&app).await;
    assert_eq!(
        (rows[0].status, rows[1].status),
        (OutboxStatus::Failed, OutboxStatus::Done)
    );
    assert_eq!(
        (rows[0].error_code.as_deref(), rows[0].last_error.as_deref()),
        (
            Some("STUDENT_MISSING"),
            Some(format!("student {gone} does not exist").as_str())
        )
    );
    assert_eq!(rows[0].failure_kind, Some(FailureKind::Rejected));
}

/// Clears student `id`'s link in the Student DB, as a hand there would; returns its id.
pub(crate) async fn unlink_by_hand(app: &TestApp, id: &str) -> Uuid {
    let student = Uuid::parse_str(id).expect("uuid");
    students::Entity::update_many()
        .col_expr(students::Column::UserId, Expr::value(Option::<Uuid>::None))
        .filter(students::Column::Id.eq(student))
        .exec(&app.student_db)
        .await
        .expect("unlink the student");
    student
}

/// Delivers one batch: the change row, the only one due, fails; returns it.
async fn the_change_fails(app: &TestApp) -> outbox::Model {
    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.failed), (1, 1));
    statuses(app).await.remove(1)
}

/// README (`link_error`, `NOT_LINKED`): a change whose student lost its link (by a hand in
/// the Student DB) while its call was at Users fails as `NOT_LINKED` when its answer is
/// recorded, as it would had the link been gone before the call; not as a link conflict,
/// which is a student linked to another user. Users holds the UpdateUser until the link
/// is cleared.
async fn a_change_whose_student_lost_its_link_while_it_was_sent_fails_as_not_linked(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let users = scripted_users(
        &app,
        Script {
            update_user_gate: Some(gate.clone()),
            ..Script::default()
        },
    )
    .await;
    let relay = app.relay_to(&users.url);
    let id = create_students(&app, 1).await.remove(0);
    assert_eq!(relay.deliver_batch().await.expect("batch").delivered, 1);
    app.rename_student(&id).await;
    let sending = tokio::spawn(async move { relay.deliver_batch().await });
    crate::support::eventually(
        "the change's call at Users",
        Duration::from_secs(20),
        || async { (users.update_user_calls.load(Ordering::SeqCst) == 1).then_some(()) },
    )
    .await;
    unlink_by_hand(&app, &id).await;
    // Enough for a call sent again after a slow moment, too.
    gate.add_permits(16);
    let outcome = sending.await.expect("task").expect("batch");
    assert_eq!((outcome.claimed, outcome.failed), (1, 1), "{outcome:?}");
    let row = statuses(&app).await.remove(1);
    assert_eq!(
        (row.status, row.failure_kind, row.error_code.as_deref()),
        (
            OutboxStatus::Failed,
            Some(FailureKind::Rejected),
            Some("NOT_LINKED")
        )
    );
}

/// A change goes to the user its student is linked to. A student unlinked by hand has
/// none: its change row fails as `NOT_LINKED` without a call, since Users would change
/// whichever user it finds for the student.
async fn a_change_of_a_student_linked_to_no_user_is_not_sent(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_students(&app, 1).await.remove(0);
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    app.rename_student(&id).await;
    let student = unlink_by_hand(&app, &id).await;
    let before = users_and_inbox_rows(&app.users_db).await;

    let row = the_change_fails(&app).await;
    assert_eq!(
        (
            row.status,
            row.failure_kind,
            row.error_code.as_deref(),
            row.last_error.as_deref()
        ),
        (
            OutboxStatus::Failed,
            Some(FailureKind::Rejected),
            Some("NOT_LINKED"),
            Some(
                format!(
                    "student {student} is linked to no user, so the change has no user to go to"
                )
                .as_str()
            )
        )
    );
    assert_eq!(
        users_and_inbox_rows(&app.users_db).await,
        before,
        "nothing sent"
    );
    let user = the_only_user(&app.users_db).await;
    assert_eq!((user.first_name.as_str(), user.source_version), ("Ana0", 1));
}

/// Student refuses invisible formatting characters in names (`validate::student_name`);
/// Users does not, so a student saved before that rule (written here straight to the
/// tables, as the older student-svc stored it) still gets its user, with the name as sent,
/// and a change saved before it still reaches that user.
async fn a_name_saved_before_students_stricter_rule_still_reaches_users(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_students(&app, 1).await.remove(0);
    const OLDER: &str = "Ana\u{200b}María";
    // Written as the older student-svc wrote them: the student's name, and each row's.
    let as_saved_before = |row: outbox::Model, rename: fn(&mut Effect)| {
        let db = &app.student_db;
        async move {
            let mut effect = Effect::decode(&row.effect_type, &row.payload).expect("an effect");
            rename(&mut effect);
            outbox::Entity::update_many()
                .col_expr(outbox::Column::Payload, Expr::value(effect.payload()))
                .filter(outbox::Column::Id.eq(row.id))
                .exec(db)
                .await
                .expect("the payload as the older service wrote it");
        }
    };
    as_saved_before(only_row(&app).await, |effect| {
        if let Effect::CreateUser(payload) = effect {
            payload.first_name = OLDER.into();
        }
    })
    .await;
    students::Entity::update_many()
        .col_expr(students::Column::FirstName, Expr::value(OLDER))
        .filter(students::Column::Id.eq(Uuid::parse_str(&id).expect("uuid")))
        .exec(&app.student_db)
        .await
        .expect("the student as the older service saved it");

    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    let user = the_only_user(&app.users_db).await;
    assert_eq!(user.first_name, OLDER);

    // A change saved before the rule, carrying such a name, is applied too.
    app.rename_student(&id).await;
    as_saved_before(statuses(&app).await.remove(1), |effect| {
        if let Effect::UpdateUser(payload) = effect {
            payload.last_name = "Pérez\u{202e}".into();
        }
    })
    .await;
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    let user = the_only_user(&app.users_db).await;
    assert_eq!(
        (user.last_name.as_str(), user.source_version),
        ("Pérez\u{202e}", 2)
    );
}

/// Users lost the student's linked user (restored from an older backup, say): the change
/// naming it is answered `USER_NOT_FOUND`, which no retry can mend, so the row fails at its
/// first attempt, `rejected`, instead of retrying until it is exhausted; Users saves nothing.
/// Once the user is restored, `retry-failed --all` sends the change to it under its key.
async fn a_change_for_a_user_users_lost_fails_at_once(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_students(&app, 1).await.remove(0);
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    let backup = the_only_user(&app.users_db).await;
    let lost = backup.id;
    users::Entity::delete_by_id(lost)
        .exec(&app.users_db)
        .await
        .expect("Users loses the user");
    app.rename_student(&id).await;
    let before = users_and_inbox_rows(&app.users_db).await;

    let row = the_change_fails(&app).await;
    assert_eq!(
        (
            row.status,
            row.attempts,
            row.failure_kind,
            row.error_code.as_deref(),
            row.last_error.as_deref()
        ),
        (
            OutboxStatus::Failed,
            1,
            Some(FailureKind::Rejected),
            Some("USER_NOT_FOUND"),
            Some(format!("user {lost} not found").as_str())
        )
    );
    let student = app
        .student
        .clone()
        .get_student(GetStudentRequest { id })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(
        (student.version, student.synced_version),
        (2, 1),
        "the rename never reached Users"
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, before);

    // The repair: the user restored into the Users DB as it was, then `retry-failed --all`,
    // which requeues the row with its own key (Users saved nothing under it).
    users::Entity::insert(users::ActiveModel::from(backup))
        .exec(&app.users_db)
        .await
        .expect("the user restored");
    let mut out = Vec::new();
    let summary = relay::retry_failed::retry_failed(
        &app.student_db,
        &app.relay().users,
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
                row.id, row.idempotency_key
            )
        )
    );
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    let renamed = stored_user(&app.users_db, lost).await;
    assert_eq!(
        (renamed.first_name.as_str(), renamed.source_version),
        ("Renamed", 2)
    );
}

/// A Users older than the relay (no ListUsers, as before it existed): `retry-failed
/// --new-key` cannot look at a rejected create-user row's student and `relay audit`
/// cannot check a linked student; each says why and to upgrade users-svc first, an error,
/// and nothing is written. The same for a Users whose ListUsers needs a student (before it
/// paged through every user): the audit cannot look for users of no student.
async fn a_users_without_list_users_is_named_by_retry_failed_and_audit_and_nothing_changes(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let older = scripted_users(
        &app,
        Script {
            no_list_users: true,
            ..Script::default()
        },
    )
    .await;
    let relay = app.relay_to(&older.url);
    let ids = create_students(&app, 2).await;
    app.users
        .clone()
        .create_user(crate::support::conflicting_user_request(1))
        .await
        .expect("another user holds student 1's number");
    assert_eq!(relay.deliver_batch().await.expect("batch").failed, 1);
    let before = statuses(&app).await;
    let rejected = before
        .iter()
        .find(|row| row.status == OutboxStatus::Failed)
        .expect("the rejected row");
    assert_eq!(rejected.aggregate_id.to_string(), ids[1]);
    const OLDER: &str = "UNIMPLEMENTED: Users has no ListUsers: it is older than this relay; upgrade users-svc first";

    let (summary, out) = retry_every_failed_row_with_a_new_key(&app, &relay.users).await;
    assert_eq!(summary.exit_code(), 2);
    assert_eq!(
        out,
        format!(
            "id={} key={} not re-keyed: cannot ask Users for student {}'s users: {OLDER}\n\
             requeued=0 linked=0 skipped=0 errors=1\n",
            rejected.id, rejected.idempotency_key, ids[1]
        )
    );
    let err = relay::audit::audit(&app.student_db, &relay.users, &mut Vec::new())
        .await
        .expect_err("the audit cannot check the linked student");
    assert_eq!(
        err.to_string(),
        format!("cannot ask Users about student {}'s users: {OLDER}", ids[0])
    );
    assert_eq!(statuses(&app).await, before, "nothing written");

    // A Users whose ListUsers answers only for one student: the audit checks the students,
    // then cannot page through Users' users, and says so.
    let by_student_only = scripted_users(
        &app,
        Script {
            list_users_by_student_only: true,
            ..Script::default()
        },
    )
    .await;
    let relay = app.relay_to(&by_student_only.url);
    let err = relay::audit::audit(&app.student_db, &relay.users, &mut Vec::new())
        .await
        .expect_err("the audit cannot page through Users' users");
    assert_eq!(
        err.to_string(),
        "cannot ask Users for its users: UNIMPLEMENTED: Users cannot list every user: it is \
         older than this relay; upgrade users-svc first"
    );
}

/// `retry-failed` asks again when Users sheds a call (over its `--max-concurrent-requests`:
/// not an answer), as the audit does: here its question about a rejected row's old key.
async fn retry_failed_asks_again_when_users_sheds_its_question(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 1).await;
    app.users
        .clone()
        .create_user(crate::support::conflicting_user_request(0))
        .await
        .expect("another user holds the number");
    assert_eq!(app.relay().deliver_batch().await.expect("batch").failed, 1);
    let rejected = only_row(&app).await;
    // The question is a CreateUser (replay-only); the first one is shed.
    let shedding = scripted_users(
        &app,
        Script {
            shed_first_create_user: Some(Duration::from_millis(10)),
            ..Script::default()
        },
    )
    .await;
    let relay = app.relay_to(&shedding.url);
    let (summary, out) = retry_every_failed_row_with_a_new_key(&app, &relay.users).await;
    let rekeyed = only_row(&app).await;
    assert_eq!(
        (summary.exit_code(), out),
        (
            0,
            format!(
                "id={} key={} requeued (new key; was {}): Users holds no user of student {}\n\
                 requeued=1 linked=0 skipped=0 errors=0\n",
                rejected.id,
                rekeyed.idempotency_key,
                rejected.idempotency_key,
                rejected.aggregate_id
            )
        )
    );
    assert_eq!(
        shedding.create_user_calls.lock().expect("calls").len(),
        2,
        "shed once, asked again"
    );
}

async fn undecodable_rows_fail_on_their_own_and_hold_back_no_one(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 3).await;
    let rows = statuses(&app).await;
    let spoil = |id: i64, column: outbox::Column, value: serde_json::Value| {
        let db = app.student_db.clone();
        async move {
            let value = match column {
                outbox::Column::EffectType => Expr::value(value.as_str().unwrap_or_default()),
                _ => Expr::value(value),
            };
            outbox::Entity::update_many()
                .col_expr(column, value)
                .filter(outbox::Column::Id.eq(id))
                .exec(&db)
                .await
                .expect("spoil the row");
        }
    };
    // The oldest row's payload does not fit its type; the next one's type is unknown.
    spoil(
        rows[0].id,
        outbox::Column::Payload,
        serde_json::json!({ "version": 1, "email": 7 }),
    )
    .await;
    spoil(
        rows[1].id,
        outbox::Column::EffectType,
        "send-flowers".into(),
    )
    .await;

    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(
        (outcome.claimed, outcome.delivered, outcome.failed),
        (3, 1, 2)
    );
    let rows = statuses(&app).await;
    let failure = |row: &outbox::Model| {
        (
            row.status,
            row.attempts,
            row.failure_kind,
            row.error_code.clone(),
            row.last_error.clone(),
        )
    };
    assert_eq!(
        failure(&rows[0]),
        (
            OutboxStatus::Failed,
            1,
            Some(FailureKind::Rejected),
            Some("UNREADABLE_PAYLOAD".to_owned()),
            Some("the stored payload cannot be decoded: invalid at line 0 column 0".to_owned())
        )
    );
    assert_eq!(
        failure(&rows[1]),
        (
            OutboxStatus::Failed,
            1,
            Some(FailureKind::Rejected),
            Some("UNKNOWN_EFFECT".to_owned()),
            Some("effect type \"send-flowers\" is not known to this relay".to_owned())
        )
    );
    assert_eq!(rows[2].status, OutboxStatus::Done);
    assert_eq!(
        users_and_inbox_rows(&app.users_db).await,
        (1, 1),
        "nothing was sent for the undecodable rows"
    );
}

async fn a_redelivery_after_a_lost_answer_is_answered_from_the_inbox(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 1).await;
    let row = only_row(&app).await;
    // Users executes the row's request, but its answer never reaches the Student side (a
    // relay that died after Users committed, or a timeout).
    let payload: CreateUserPayload = serde_json::from_value(row.payload.clone()).expect("payload");
    let lost = app
        .users
        .clone()
        .create_user(CreateUserRequest {
            idempotency_key: row.idempotency_key.clone(),
            email: payload.email,
            first_name: payload.first_name,
            last_name: payload.last_name,
            document_number: payload.document_number,
            student_id: payload.student_id.to_string(),
        })
        .await
        .expect("executed")
        .into_inner()
        .user_id;
    assert_eq!(only_row(&app).await.status, OutboxStatus::Pending);

    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(outcome.delivered, 1);
    let links = assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
    assert_eq!(
        links[&row.aggregate_id].to_string(),
        lost,
        "the student is linked to the user created first"
    );
}

/// README ("Retry"): a transient failure puts the row back after capped exponential backoff
/// with full jitter. Users stays down; 64 rows fail together five times (base 200 ms, cap
/// 1.6 s). After attempt k each row's delay lies in [0, min(1.6 s, 200 ms · 2^(k-1))], and
/// over 64 rows the delays reach past half that ceiling and spread over half of it (each
/// false for a correct relay with odds below 2^-50): a delay that did not grow with the
/// attempts, passed the cap, or came without jitter (all rows back together) fails it.
async fn retry_delays_double_up_to_the_cap_spread_by_jitter(backend: Backend) {
    const ROWS: usize = 64;
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, ROWS).await;
    let (_refusing, closed) = crate::support::refusing_addr();
    let relay = app.relay_with(
        &format!("http://{closed}"),
        relay::RunConfig {
            batch_size: 64,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_millis(1_600),
            max_attempts: 10,
            ..crate::support::app::test_tuning()
        },
    );
    for (attempt, ceiling_ms) in (1..).zip([200i64, 400, 800, 1_600, 1_600]) {
        // Every row is due again, by the clock that dates them: PostgreSQL's (which may
        // not be this host's), SQLite's rows the relay's.
        let due = statuses(&app)
            .await
            .iter()
            .map(|row| row.available_at)
            .max()
            .expect("rows");
        crate::support::eventually("every row due", Duration::from_secs(10), || async {
            (clock_of_the_rows(&app).await > due + Duration::from_millis(20)).then_some(())
        })
        .await;
        let before = clock_of_the_rows(&app).await;
        let outcome = relay.deliver_batch().await.expect("batch");
        let after = clock_of_the_rows(&app).await;
        assert_eq!(
            (outcome.claimed, outcome.retried),
            (ROWS, ROWS),
            "{outcome:?}"
        );
        let rows = statuses(&app).await;
        assert!(rows.iter().all(|row| row.attempts == attempt), "{rows:?}");
        // Each delay was set between `before` and `after`: `available_at - after` is at
        // most the delay, `available_at - before` at least.
        let since = |at: chrono::DateTime<chrono::Utc>| {
            rows.iter()
                .map(|row| (row.available_at - at).num_milliseconds())
                .collect::<Vec<_>>()
        };
        let (least, most) = (since(after), since(before));
        let longest_least = least.iter().max().copied().unwrap_or_default();
        assert!(
            longest_least <= ceiling_ms + 5,
            "attempt {attempt}: a delay of {longest_least} ms past the ceiling {ceiling_ms} ms"
        );
        let longest_most = most.iter().max().copied().unwrap_or_default();
        assert!(
            longest_most >= ceiling_ms / 2,
            "attempt {attempt}: no delay reached half the ceiling {ceiling_ms} ms: {most:?}"
        );
        let spread = longest_least - least.iter().min().copied().unwrap_or_default();
        assert!(
            spread >= ceiling_ms / 2,
            "attempt {attempt}: the delays spread over {spread} ms only, not jittered"
        );
    }
}

/// Now, by the clock that dates a retried row's `available_at`: PostgreSQL's, or on SQLite
/// the relay's (this process's).
pub(crate) async fn clock_of_the_rows(app: &TestApp) -> chrono::DateTime<chrono::Utc> {
    match app.student_db.get_database_backend() {
        sea_orm::DbBackend::Postgres => app
            .student_db
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT clock_timestamp() AS now",
            ))
            .await
            .expect("the database's clock")
            .expect("a row")
            .try_get("", "now")
            .expect("now"),
        _ => platform::db::now(),
    }
}

async fn users_down_keeps_rows_pending_with_backoff(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 1).await;
    // A port that refuses connections for as long as this test runs.
    let (_refusing, closed) = crate::support::refusing_addr();
    let before = platform::db::now();
    let outcome = app
        .relay_to(&format!("http://{closed}"))
        .deliver_batch()
        .await
        .expect("batch");
    assert_eq!(
        outcome,
        BatchOutcome {
            claimed: 1,
            delivered: 0,
            retried: 1,
            failed: 0,
            released: 0,
            superseded: 0,
        }
    );

    let row = only_row(&app).await;
    assert_eq!((row.status, row.attempts), (OutboxStatus::Pending, 1));
    assert_eq!(
        row.error_code.as_deref(),
        Some("UNAVAILABLE"),
        "{:?}",
        row.last_error
    );
    assert!(
        row.available_at >= before,
        "backoff moves available_at forward"
    );
    assert!(
        row.available_at <= platform::db::now() + Duration::from_secs(1),
        "first backoff is at most the base delay"
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));

    // Once Users is back and the backoff has passed, the same row is delivered.
    let delivered = crate::support::eventually(
        "the row to be delivered after backoff",
        Duration::from_secs(10),
        || async {
            let outcome = app.relay().deliver_batch().await.expect("batch");
            (outcome.delivered == 1).then_some(outcome)
        },
    )
    .await;
    assert_eq!(delivered.retried, 0);
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

async fn a_rejection_fails_the_row_and_shows_on_the_student(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = create_students(&app, 1).await.remove(0);
    // Another enabled user already holds the document number (created directly in Users).
    app.users
        .clone()
        .create_user(crate::support::conflicting_user_request(0))
        .await
        .expect("the other user");

    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(
        outcome,
        BatchOutcome {
            claimed: 1,
            delivered: 0,
            retried: 0,
            failed: 1,
            released: 0,
            superseded: 0,
        }
    );
    let row = only_row(&app).await;
    assert_eq!((row.status, row.attempts), (OutboxStatus::Failed, 1));
    let message = "document_number is already used by another enabled user";
    assert_eq!(
        (row.error_code.as_deref(), row.last_error.as_deref()),
        (Some("DOCUMENT_NUMBER_TAKEN"), Some(message))
    );
    let expected_error = format!("DOCUMENT_NUMBER_TAKEN: {message}");

    let student = app
        .student
        .clone()
        .get_student(GetStudentRequest { id })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(student.user_link_status(), UserLinkStatus::Failed);
    assert_eq!(student.link_error, expected_error);
    assert_eq!(student.user_id, "");
    // A failed row is never picked up again.
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch"),
        BatchOutcome::default()
    );
    // One user (the other one), two inbox rows (its key, and the saved rejection).
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (1, 2));
}

/// `relay replay` of `selection` through `relay`: its summary and what it printed.
async fn replayed(
    app: &TestApp,
    relay: &relay::Relay,
    selection: &replay::Selection,
) -> (replay::ReplaySummary, String) {
    let mut out = Vec::new();
    let summary = replay::replay(&app.student_db, &relay.users, selection, &mut out)
        .await
        .expect("replay");
    (summary, String::from_utf8(out).expect("utf-8"))
}

async fn replay_answers_from_the_inbox_and_creates_nothing(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let ids = create_students(&app, 3).await;
    app.relay().deliver_batch().await.expect("batch");
    let links = assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 3).await;
    let relay = app.relay();

    let (summary, out) = replayed(&app, &relay, &replay::Selection::All).await;
    assert_eq!(
        summary,
        replay::ReplaySummary {
            replayed: 3,
            matched: 3,
            mismatched: 0,
            errors: 0
        }
    );
    assert_eq!(summary.exit_code(), 0);
    let rows = outbox::Entity::find()
        .order_by_asc(outbox::Column::Id)
        .all(&app.student_db)
        .await
        .expect("outbox");
    let mut expected: Vec<String> = rows
        .iter()
        .map(|row| {
            format!(
                "key={} effect=create-user student={} user={} from_inbox=true matches_link=true",
                row.idempotency_key, row.aggregate_id, links[&row.aggregate_id]
            )
        })
        .collect();
    expected.push("replayed=3 matched=3 mismatched=0 errors=0".into());
    assert_eq!(out.lines().collect::<Vec<_>>(), expected);
    assert_eq!(
        users_and_inbox_rows(&app.users_db).await,
        (3, 3),
        "a replay creates nothing"
    );

    // One student, by id.
    let one = Uuid::parse_str(&ids[1]).expect("uuid");
    let (summary, _) = replayed(&app, &relay, &replay::Selection::Student(one)).await;
    assert_eq!((summary.replayed, summary.matched), (1, 1));
    // A selection naming nothing delivered is an error (exit 2), an unknown key or
    // student alike.
    let stranger = Uuid::now_v7();
    for (selection, named) in [
        (
            replay::Selection::Key("nope".into()),
            "--key nope".to_owned(),
        ),
        (
            replay::Selection::Student(stranger),
            format!("--student {stranger}"),
        ),
    ] {
        let (summary, out) = replayed(&app, &relay, &selection).await;
        assert_eq!(summary.exit_code(), 2);
        assert_eq!(
            out,
            format!(
                "no delivered outbox row matches {named}\nreplayed=0 matched=0 mismatched=0 errors=1\n"
            )
        );
    }

    // A key Users does not hold (here a row's key swapped for one never executed, as after
    // a Users restore from an older backup): that row's line is an error, and the run
    // says so in its count and exit code (2), never "all agree".
    outbox::Entity::update_many()
        .col_expr(outbox::Column::IdempotencyKey, Expr::value("never-ran"))
        .filter(outbox::Column::Id.eq(rows[0].id))
        .exec(&app.student_db)
        .await
        .expect("key swapped");
    let (summary, out) = replayed(&app, &relay, &replay::Selection::All).await;
    assert_eq!(
        (
            summary.replayed,
            summary.matched,
            summary.errors,
            summary.exit_code()
        ),
        (3, 2, 1, 2)
    );
    assert!(
        out.lines()
            .next()
            .is_some_and(|line| line.starts_with(&format!(
                "key=never-ran effect=create-user student={} error=",
                rows[0].aggregate_id
            ))),
        "{out}"
    );
    assert_eq!(
        users_and_inbox_rows(&app.users_db).await,
        (3, 3),
        "nothing created"
    );
}

async fn status_counts_rows_per_status(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let report = relay::status::read(&app.student_db).await.expect("status");
    assert_eq!(report, relay::status::OutboxReport::default());

    create_students(&app, 2).await;
    // The oldest row is the one with the lowest id, written an hour ago here.
    let first = outbox::Entity::find()
        .order_by_asc(outbox::Column::Id)
        .one(&app.student_db)
        .await
        .expect("read")
        .expect("a row");
    outbox::Entity::update_many()
        .col_expr(
            outbox::Column::CreatedAt,
            Expr::value(chrono::Utc::now() - chrono::TimeDelta::hours(1)),
        )
        .filter(outbox::Column::Id.eq(first.id))
        .exec(&app.student_db)
        .await
        .expect("dated back");
    let report = relay::status::read(&app.student_db).await.expect("status");
    assert_eq!(
        (
            report.pending,
            report.processing,
            report.done,
            report.failed,
            report.retrying,
            report.blocked
        ),
        (2, 0, 0, 0, 0, 0),
        "fresh rows are neither retrying nor blocked"
    );
    assert!(
        (3_600..3_660).contains(&report.oldest_pending_age_seconds),
        "{}",
        report.oldest_pending_age_seconds
    );

    app.relay().deliver_batch().await.expect("batch");
    let report = relay::status::read(&app.student_db).await.expect("status");
    assert_eq!(
        report,
        relay::status::OutboxReport {
            done: 2,
            ..Default::default()
        }
    );

    // `relay status` counts `done` rows; the metrics gauge estimates them. On
    // PostgreSQL the estimate is the planner's, frozen here at the ANALYZE (autovacuum
    // off for this table so nothing refreshes it): three more links move the count and
    // leave the estimate where it was, so a status that estimated would print 2.
    // A failed row too, which the estimate takes out with the other rows counted exactly.
    if backend == Backend::Postgres {
        for sql in [
            "ALTER TABLE outbox SET (autovacuum_enabled = false)",
            "INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
               idempotency_key, status, attempts, available_at, created_at, processed_at) \
             VALUES (gen_random_uuid(), 1, 'create-user', '{}', 'a-failed-key', 'failed', 1, \
               now(), now(), now())",
            "ANALYZE outbox",
        ] {
            app.student_db.execute_unprepared(sql).await.expect(sql);
        }
    }
    create_students_from(&app, 2..5).await;
    app.relay().deliver_batch().await.expect("batch");
    let report = relay::status::read(&app.student_db).await.expect("status");
    assert_eq!((report.pending, report.done), (0, 5));
    let estimated = relay::metrics::gauge_report(&app.student_db)
        .await
        .expect("report")
        .done;
    let frozen_estimate = match backend {
        Backend::Postgres => 2,
        Backend::Sqlite => 5,
    };
    assert_eq!(estimated, frozen_estimate);
}

/// `relay status`'s `blocked` (and the `OutboxRowsBlocked` alert's gauge) counts the rows
/// waiting behind a failed row of their own student, nothing else: not a student's later
/// changes queued behind its own pending row, nor other students' rows. Student Y's
/// creation failed and its rename waits behind it; student X has its creation and two
/// renames queued.
async fn status_counts_as_blocked_only_the_rows_behind_a_failed_row_of_their_student(
    backend: Backend,
) {
    use proto::student::v1::UpdateStudentRequest;

    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rename = |id: &str, n: usize, first_name: &str| {
        let request = student_request(n);
        UpdateStudentRequest {
            id: id.to_owned(),
            first_name: first_name.to_owned(),
            last_name: request.last_name,
            email: request.email,
            idempotency_key: None,
            expected_version: 0,
        }
    };
    let y = create_students_from(&app, 0..1).await.remove(0);
    crate::relay_claims::claim_and_exhaust(&app.student_db, "relay-test").await;
    let mut student = app.student.clone();
    student
        .update_student(rename(&y, 0, "Renamed"))
        .await
        .expect("Y renamed");
    let x = create_students_from(&app, 1..2).await.remove(0);
    for first_name in ["Once", "Twice"] {
        student
            .update_student(rename(&x, 1, first_name))
            .await
            .expect("X renamed");
    }
    let report = relay::status::read(&app.student_db).await.expect("status");
    assert_eq!(
        (
            report.pending,
            report.processing,
            report.failed,
            report.blocked,
            report.retrying
        ),
        (3, 0, 1, 1, 0)
    );
}

/// A relay upgraded before Users: its many-row call is refused as unknown, and it sends the
/// same rows one CreateUser call each, at once and from then on (one CreateUsers call in
/// all): every row linked at its first attempt, none failed.
async fn a_users_without_create_users_gets_one_call_per_row(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let users = scripted_users(
        &app,
        Script {
            refuse_create_users: Some(Code::Unimplemented),
            ..Script::default()
        },
    )
    .await;
    let relay = app.relay_to(&users.url);
    create_students(&app, 3).await;
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (3, 3), "{outcome:?}");
    create_students_from(&app, 3..5).await;
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (2, 2), "{outcome:?}");
    assert_eq!(
        users.create_users_calls.load(Ordering::SeqCst),
        1,
        "asked once"
    );
    assert_linked_at_first_attempt(&statuses(&app).await);
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 5).await;
}

/// A CreateUsers call Users refuses whole as INVALID_ARGUMENT judged no item (a bad item
/// is answered in its own slot): its rows go one CreateUser call each, and each gets its
/// own verdict, here delivered at attempt 1, none failed for the call's sake.
async fn a_call_refused_whole_as_invalid_sends_its_rows_one_call_each(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let users = scripted_users(
        &app,
        Script {
            refuse_create_users: Some(Code::InvalidArgument),
            ..Script::default()
        },
    )
    .await;
    create_students(&app, 3).await;
    let outcome = app
        .relay_to(&users.url)
        .deliver_batch()
        .await
        .expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (3, 3), "{outcome:?}");
    assert_eq!(users.create_users_calls.load(Ordering::SeqCst), 1);
    assert_linked_at_first_attempt(&statuses(&app).await);
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 3).await;
}

/// README: "each shed call is sent again after Users' `RetryInfo` wait", not after the
/// relay's own backoff. Users sheds the first call asking for 300 ms; the relay's own
/// backoff is 1 ms: the call is sent again no sooner than asked, within the same attempt.
async fn a_shed_call_is_sent_again_after_the_wait_users_asks_for(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    const ASKED: Duration = Duration::from_millis(300);
    let users = scripted_users(
        &app,
        Script {
            shed_first_create_user: Some(ASKED),
            ..Script::default()
        },
    )
    .await;
    create_students(&app, 1).await;
    let relay = app.relay_with(
        &users.url,
        relay::RunConfig {
            backoff_base: Duration::from_millis(1),
            ..crate::support::app::test_tuning()
        },
    );
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (1, 1), "{outcome:?}");
    let calls = users.create_user_calls.lock().expect("calls").clone();
    assert_eq!(calls.len(), 2, "shed once, then answered");
    let waited = calls[1] - calls[0];
    assert!(waited >= ASKED, "sent again after {waited:?}");
    // A shed call costs no attempt.
    assert_linked_at_first_attempt(&statuses(&app).await);
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

/// README ("Shed calls cost nothing"): a shed call is sent again after the `RetryInfo` wait
/// times a random 1–2, so shed calls do not return together. Forty rows, each sent alone,
/// each shed once with a wait of 300 ms: each comes back no sooner than asked, and the
/// forty waits spread over more than half the wait (without the random factor they would
/// all be 300 ms and a little; with it, a spread under 150 ms has odds below 2^-33).
async fn shed_calls_come_back_spread_over_one_to_two_times_the_wait(backend: Backend) {
    const ROWS: usize = 40;
    const ASKED: Duration = Duration::from_millis(300);
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let users = scripted_users(
        &app,
        Script {
            shed_each_keys_first_create_user: Some(ASKED),
            ..Script::default()
        },
    )
    .await;
    create_students(&app, ROWS).await;
    let relay = app.relay_with(
        &users.url,
        relay::RunConfig {
            rows_per_call: 1,
            backoff_base: Duration::from_millis(1),
            // Room for forty calls on a slow machine: a row given back would end the test.
            call_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(20),
            ..crate::support::app::test_tuning()
        },
    );
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!(
        (outcome.claimed, outcome.delivered),
        (ROWS, ROWS),
        "{outcome:?}"
    );
    let calls = users
        .create_user_calls_by_key
        .lock()
        .expect("calls")
        .clone();
    assert_eq!(calls.len(), 2 * ROWS, "each row shed once, then answered");
    let waits: Vec<Duration> = statuses(&app)
        .await
        .iter()
        .map(|row| {
            let sent: Vec<_> = calls
                .iter()
                .filter(|(key, _)| *key == row.idempotency_key)
                .map(|(_, at)| *at)
                .collect();
            assert_eq!(sent.len(), 2, "{}", row.idempotency_key);
            sent[1] - sent[0]
        })
        .collect();
    let (shortest, longest) = (
        waits.iter().min().copied().unwrap_or_default(),
        waits.iter().max().copied().unwrap_or_default(),
    );
    assert!(shortest >= ASKED, "one came back after {shortest:?}");
    assert!(
        longest - shortest >= ASKED / 2,
        "the waits spread over {:?} only: {waits:?}",
        longest - shortest
    );
    assert_linked_at_first_attempt(&statuses(&app).await);
}

/// README (Shutdown): a stopping relay lets its calls finish but sends no shed call again.
/// Users sheds every call, asking for 1 s; once the row's call has been sent twice (the
/// relay now waits 1–2 s to send it again) the relay is told to stop, and it stops without
/// sending it again, the row back `pending` with its attempt handed back. Sent again until
/// its lease ran short (20 s less a 2 s call), it would go to Users some ten times more and
/// hold the stop for most of the lease.
async fn a_stopping_relay_sends_no_shed_call_again_and_hands_its_row_back(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let users = scripted_users(
        &app,
        Script {
            shed_every_create_user: Some(Duration::from_secs(1)),
            ..Script::default()
        },
    )
    .await;
    create_students(&app, 1).await;
    let relay = app.relay_with(
        &users.url,
        relay::RunConfig {
            lease: Duration::from_secs(20),
            ..crate::support::app::test_tuning()
        },
    );
    let running = RunningRelay::start(relay);
    let calls = || users.create_user_calls.lock().expect("calls").len();
    crate::support::eventually(
        "the shed call sent again",
        Duration::from_secs(20),
        || async { (calls() >= 2).then_some(()) },
    )
    .await;
    let when_told = calls();
    let told = clock_of_the_rows(&app).await;
    running.tell_to_stop();
    running.stopped().await;
    assert_eq!(
        calls(),
        when_told,
        "no call sent after the relay was told to stop"
    );
    let row = statuses(&app).await.remove(0);
    assert_eq!(
        (row.status, row.attempts, row.locked_by),
        (OutboxStatus::Pending, 0, None),
        "back, its attempt handed back"
    );
    // Due after the wait Users asked for (1 s), not at once to a Users shedding load.
    assert!(
        row.available_at >= told + chrono::TimeDelta::seconds(1),
        "{} due before {told} + 1 s",
        row.available_at
    );
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

/// README (Shutdown): a CreateUsers call refused as a whole is sent again one call per row,
/// but not by a stopping relay, whose stop would wait for those calls too. Users holds the
/// call of two rows until the relay is told to stop, then refuses it whole: no CreateUser
/// call follows, and both rows go back `pending`, attempt unused, for another relay.
async fn a_stopping_relay_whose_create_users_call_is_refused_whole_starts_no_call_for_its_rows(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let users = scripted_users(
        &app,
        Script {
            refuse_create_users: Some(Code::InvalidArgument),
            create_users_gate: Some(gate.clone()),
            ..Script::default()
        },
    )
    .await;
    create_students(&app, 2).await;
    let relay = app.relay_to(&users.url);
    let running = RunningRelay::start(relay);
    crate::support::eventually(
        "the rows' CreateUsers call at Users",
        Duration::from_secs(20),
        || async { (users.create_users_calls.load(Ordering::SeqCst) == 1).then_some(()) },
    )
    .await;
    running.tell_to_stop();
    gate.add_permits(1);
    running.stopped().await;
    assert_eq!(
        users.create_user_calls.lock().expect("calls").len(),
        0,
        "no call sent after the relay was told to stop"
    );
    for row in statuses(&app).await {
        assert_eq!(
            (row.status, row.attempts, row.locked_by),
            (OutboxStatus::Pending, 0, None),
            "back, its attempt unused"
        );
    }
    assert_eq!(users_and_inbox_rows(&app.users_db).await, (0, 0));
}

/// README: "A lone row, and every change row, goes in a call of its own": a claim of one
/// create-user row and one update-user row makes one CreateUser call (and an UpdateUser
/// call), never a one-item CreateUsers.
async fn a_lone_create_user_row_beside_a_change_goes_as_create_user(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let users = scripted_users(&app, Script::default()).await;
    let relay = app.relay_to(&users.url);
    let first = create_students(&app, 1).await.remove(0);
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (1, 1), "{outcome:?}");
    let sent = student_request(0);
    app.student
        .clone()
        .update_student(proto::student::v1::UpdateStudentRequest {
            id: first,
            first_name: "Renamed".into(),
            last_name: sent.last_name,
            email: sent.email,
            idempotency_key: None,
            expected_version: 1,
        })
        .await
        .expect("renamed");
    create_students_from(&app, 1..2).await;
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (2, 2), "{outcome:?}");
    assert_eq!(users.create_user_calls.lock().expect("calls").len(), 2);
    assert_eq!(users.create_users_calls.load(Ordering::SeqCst), 0);
}

/// Sixty students whose fields are as long as validation allows (about 1.2 KB a row) make
/// one CreateUsers call larger than Users' 64 KiB request limit: Users refuses it whole
/// (OUT_OF_RANGE, no item judged), and the relay sends the same rows one call each: every
/// row linked at its first attempt, none failed, and the users not written together.
async fn rows_too_large_for_one_call_go_one_call_each(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for n in 0..60 {
        let request = proto::student::v1::CreateStudentRequest {
            first_name: format!("{}{n:02}", "𝓐".repeat(98)),
            last_name: "𝓑".repeat(100),
            // 254 characters, the most an address may have: every column must hold it (a
            // length PostgreSQL enforces; SQLite ignores them).
            email: format!(
                "{}{n:02}@{}.{}.{}.edu",
                "a".repeat(62),
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(57)
            ),
            document_number: format!("DOC-{}-{n:02}", "X".repeat(25)),
            idempotency_key: None,
        };
        app.student
            .clone()
            .create_student(request)
            .await
            .expect("a valid student");
    }
    let relay = app.relay_with(
        &app.users_url(),
        relay::RunConfig {
            rows_per_call: 100,
            ..crate::support::app::test_tuning()
        },
    );
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!(
        (outcome.claimed, outcome.delivered),
        (60, 60),
        "{outcome:?}"
    );
    assert_linked_at_first_attempt(&statuses(&app).await);
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 60).await;
    let stored = users::Entity::find()
        .all(&app.users_db)
        .await
        .expect("users");
    assert!(stored.iter().all(|user| user.email.chars().count() == 254));
    // One transaction would have written every user at one time.
    let times: std::collections::HashSet<_> = stored.iter().map(|user| user.created_at).collect();
    assert!(times.len() > 1, "the users were written one call each");
}
