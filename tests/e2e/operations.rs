//! Day two, against the three real binaries: the metrics each exports move with the work
//! done, and the alert rules and dashboard in `ops/` name only metrics that exist; `relay
//! audit` finds every kind of disagreement between the two databases, and nothing else;
//! retention deletes only delivered rows (never one in flight) and old inbox keys, and a
//! key older than the inbox's memory is refused, never executed a second time. (Traces,
//! in logs and at a collector: `traces.rs`.)

use std::collections::BTreeSet;

use nix::sys::signal::Signal;
use platform::failpoint::points;
use proto::{
    student::v1::{CreateStudentRequest, UpdateStudentRequest},
    users::v1::CreateUserRequest,
};
use sea_orm::{
    ColumnTrait as _, ConnectionTrait as _, DbBackend, EntityTrait as _, QueryFilter as _,
    QueryOrder as _, QueryTrait as _, sea_query::Expr,
};
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
        Backend,
        app::spawn_app,
        conflicting_user_request, eventually, explained, insert_unlinked_students,
        insert_users_of_no_student,
        invariants::{
            assert_each_student_linked_exactly_once, stored_user, students_and_outbox_rows,
            users_and_inbox_rows,
        },
        metrics::{
            WITH_A_COLLECTOR, alert_test_series, exported_names, gauge, has_label_value,
            label_names, ops_expressions, promql_names, sample, scrape,
        },
        stack::{LINK_DEADLINE, Stack},
        student_request, user_of_no_student,
    },
};

on_both_backends!(
    metrics_of_each_process_move_as_work_is_done,
    waits_for_sqlites_write_lock_are_counted,
    what_the_alerts_watch_moves_when_deliveries_go_wrong,
    audit_reports_each_disagreement_between_the_databases,
    a_change_on_its_way_to_users_is_no_disagreement,
    a_student_db_restored_from_an_older_backup_creates_no_user_twice_and_the_audit_names_the_rest,
    after_a_users_db_restore_resend_gives_users_back_what_it_lost,
    resend_refuses_what_would_make_a_second_user_and_changes_nothing,
    restoring_the_users_db_by_the_day_two_routine_gives_each_student_its_user_back,
    an_audit_asks_again_for_the_lookups_users_sheds,
    an_inbox_cache_of_no_entries_reads_every_replay_from_the_table,
    retention_purges_only_what_is_safe_and_users_refuses_keys_past_its_horizon,
    rows_past_the_horizon_sent_together_are_each_refused,
    purge_leaves_a_row_in_flight_to_be_delivered_once,
    student_client_keys_outlive_the_purge_only_where_their_record_does,
    purges_and_gauges_find_their_rows_through_indexes_never_the_history,
);

/// README ("Following one student", `relay audit`): between the version Users is recorded
/// to have applied and the student's is a change still on its way, not a disagreement:
/// linked students renamed while no relay runs (version 2, Users at 1) are clean.
async fn a_change_on_its_way_to_users_is_no_disagreement(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..2).await;
    stack.wait_until_all_linked(2).await;
    stack.kill_relays();
    for id in &ids {
        assert_eq!(stack.rename_student(id, "Renamed").await, 2);
    }
    stack.assert_audit_clean(2);
    let users = users::Entity::find()
        .all(&stack.users_db)
        .await
        .expect("users");
    assert!(
        users.iter().all(|user| user.source_version == 1),
        "no rename delivered yet"
    );
}

/// README ("Day-two routine", restoring the Users DB), the routine run as written, in its
/// order, against a restore that lost student 0's user and its keys, while a rename of
/// student 0 made after the restore failed `USER_NOT_FOUND` (the user it names is gone)
/// and the relays kept running: restart users-svc, `relay audit` names the lost user,
/// `relay resend --all` sends the student's delivered rows again (its user created again,
/// with a new id, and linked), `relay retry-failed --all` requeues the failed rename with
/// its own key, and once the rows are delivered `relay audit` is clean: student 0's user
/// is back, renamed, at the student's version, and no student has a second user.
async fn restoring_the_users_db_by_the_day_two_routine_gives_each_student_its_user_back(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..2).await;
    stack.wait_until_all_linked(2).await;
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 2).await;
    let student_id = Uuid::parse_str(&ids[0]).expect("uuid");
    let lost = links[&student_id];
    let create_row = stack
        .outbox_rows()
        .await
        .into_iter()
        .find(|row| row.aggregate_id == student_id)
        .expect("its row");

    // The restore: a backup taken before student 0's user was created.
    users::Entity::delete_by_id(lost)
        .exec(&stack.users_db)
        .await
        .expect("a user the backup lacks");
    users_svc::entity::inbox::Entity::delete_by_id(create_row.idempotency_key.clone())
        .exec(&stack.users_db)
        .await
        .expect("its key, which the backup lacks");
    stack.restart_users(None).await;
    // Meanwhile the student is renamed: the change goes to the user it is linked to,
    // which Users no longer has, and fails at once.
    assert_eq!(stack.rename_student(&ids[0], "Renamed").await, 2);
    let rename = eventually("the rename to fail", LINK_DEADLINE, || async {
        stack.outbox_rows().await.into_iter().find(|row| {
            row.aggregate_id == student_id
                && row.aggregate_version == 2
                && row.status == OutboxStatus::Failed
        })
    })
    .await;
    assert_eq!(
        rename.error_code.as_deref(),
        Some("USER_NOT_FOUND"),
        "{rename:?}"
    );

    // The routine.
    stack.assert_audit_finds(
        2,
        &[format!(
            "student {}: linked to user {lost}, which Users does not have",
            ids[0]
        )],
    );
    let resend = stack.relay_command(&["resend", "--all"]);
    assert_eq!(
        (
            resend.status.code(),
            String::from_utf8_lossy(&resend.stdout).into_owned()
        ),
        (
            Some(0),
            format!(
                "student {}: user {lost} is not in Users: link cleared; requeued with their \
                 keys: rows {}\nresent=1 refused=0 unchanged=1\n",
                ids[0], create_row.id
            )
        ),
        "{}",
        String::from_utf8_lossy(&resend.stderr)
    );
    let retry = stack.relay_command(&["retry-failed", "--all"]);
    assert_eq!(
        retry.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&retry.stdout)
    );
    stack.wait_until_all_linked(2).await;
    stack.wait_until_all_synced(2).await;
    stack.assert_audit_finds(2, &[]);
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 2).await;
    let again = links[&student_id];
    assert_ne!(again, lost, "created again: a new id");
    let user = stored_user(&stack.users_db, again).await;
    assert_eq!(
        (
            user.student_id,
            user.first_name.as_str(),
            user.source_version
        ),
        (student_id, "Renamed", 2)
    );
}

/// README ("relay resend"): the refusals that keep a resend from making a second user, each
/// changing nothing: Users holds another user of the student (made by hand here), not its
/// linked one; the linked user belongs to another student in Users; the create-user row
/// that would create the user again was purged. And the resend's own transaction refuses
/// (`Changed`) when the student's link, its recorded version or its delivered rows are no
/// longer what it was judged on, as when the student changed while it was judged, and
/// (`Busy`) when a row of the student waits to be delivered. A Users
/// that does not answer is no verdict: exit 2, naming it, for one student and for all.
async fn resend_refuses_what_would_make_a_second_user_and_changes_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..4).await;
    stack.wait_until_all_linked(4).await;
    stack.kill_relays();
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
    let student_id = |n: usize| Uuid::parse_str(&ids[n]).expect("uuid");
    let link = |n: usize| links[&student_id(n)];
    let rows_before = stack.outbox_rows().await;
    let row_of = |n: usize| {
        rows_before
            .iter()
            .find(|row| row.aggregate_id == student_id(n))
            .expect("its create-user row")
            .clone()
    };

    // Student 0: its user lost, and another user of it made by hand since.
    users::Entity::delete_by_id(link(0))
        .exec(&stack.users_db)
        .await
        .expect("delete");
    let other = stack
        .users_client()
        .create_user(CreateUserRequest {
            student_id: ids[0].clone(),
            idempotency_key: "by-hand".into(),
            ..conflicting_user_request(0)
        })
        .await
        .expect("created by hand")
        .into_inner()
        .user_id;
    // Student 1: its user now belongs to another student in Users.
    let elsewhere = Uuid::now_v7();
    users::Entity::update_many()
        .col_expr(users::Column::StudentId, Expr::value(elsewhere))
        .filter(users::Column::Id.eq(link(1)))
        .exec(&stack.users_db)
        .await
        .expect("moved");
    // Student 2: its user and key lost, and its create-user row purged.
    users::Entity::delete_by_id(link(2))
        .exec(&stack.users_db)
        .await
        .expect("delete");
    users_svc::entity::inbox::Entity::delete_by_id(row_of(2).idempotency_key)
        .exec(&stack.users_db)
        .await
        .expect("forget its key");
    outbox::Entity::delete_by_id(row_of(2).id)
        .exec(&stack.student_db)
        .await
        .expect("purged");
    stack.restart_users(None).await;

    let refused = |n: usize, why: String| format!("student {}: {why}; nothing changed\n", ids[n]);
    let all = stack.relay_command(&["resend", "--all"]);
    assert_eq!(
        (
            all.status.code(),
            String::from_utf8_lossy(&all.stdout).into_owned()
        ),
        (
            Some(1),
            format!(
                "{}{}{}resent=0 refused=3 unchanged=1\n",
                refused(
                    0,
                    format!(
                        "Users holds other users of it ({other}), not its linked user {}: a \
                         resend would create one more",
                        link(0)
                    )
                ),
                refused(
                    1,
                    format!(
                        "its linked user {} belongs to student {elsewhere} in Users",
                        link(1)
                    )
                ),
                refused(
                    2,
                    "no delivered create-user row is left (purged) to create the user again"
                        .to_owned()
                ),
            )
        ),
        "{}",
        String::from_utf8_lossy(&all.stderr)
    );

    // Student 3, judged on what it no longer is: a link, a recorded version or a set of
    // delivered rows that changed since.
    let row = row_of(3);
    for (judged_on, ids) in [
        ((Uuid::now_v7(), 1), vec![row.id]),
        ((link(3), 2), vec![row.id]),
        ((link(3), 1), vec![]),
        ((link(3), 1), vec![row.id, row.id + 1_000]),
    ] {
        let resent = student_store::resend::resend(
            &stack.student_db,
            student_id(3),
            judged_on,
            student_store::resend::Lost::User,
            &ids,
        )
        .await
        .expect("resend");
        assert_eq!(
            resent,
            student_store::resend::Resent::Changed,
            "{judged_on:?} {ids:?}"
        );
    }
    // And `Busy` when a row of the student waits (a change queued, or a redrive since it
    // was judged): checked inside the transaction once the student's row is locked, since
    // a row already waiting would reach Users ahead of the ones going back.
    let set_status = |status: OutboxStatus| {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::Status, Expr::value(status))
            .filter(outbox::Column::Id.eq(row.id))
            .exec(&stack.student_db)
    };
    // A row waiting, or one being delivered (claimed meanwhile), holds the resend back.
    for busy in [OutboxStatus::Pending, OutboxStatus::Processing] {
        set_status(busy).await.expect("busy");
        let resent = student_store::resend::resend(
            &stack.student_db,
            student_id(3),
            (link(3), 1),
            student_store::resend::Lost::User,
            &[row.id],
        )
        .await
        .expect("resend");
        assert_eq!(resent, student_store::resend::Resent::Busy, "{busy:?}");
    }
    set_status(OutboxStatus::Done).await.expect("as it was");

    // Users not answering: no verdict, an error (exit 2), for one student and for all.
    stack.kill_users();
    let cannot_ask = format!("error: cannot ask Users for student {}'s users: ", ids[0]);
    for args in [
        &["resend", "--student", ids[0].as_str()][..],
        &["resend", "--all"],
    ] {
        let output = stack.relay_command(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            (
                output.status.code(),
                String::from_utf8_lossy(&output.stdout)
            ),
            (Some(2), "".into()),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(&cannot_ask), "{args:?}: {stderr}");
    }

    // Nothing changed: every student linked as before, at version 1, every row as it was.
    for n in 0..4 {
        let student = students::Entity::find_by_id(student_id(n))
            .one(&stack.student_db)
            .await
            .expect("students")
            .expect("the student");
        assert_eq!(
            (student.user_id, student.synced_version),
            (Some(link(n)), 1)
        );
    }
    let rows_after = stack.outbox_rows().await;
    let kept: Vec<_> = rows_before
        .into_iter()
        .filter(|row| row.aggregate_id != student_id(2))
        .collect();
    assert_eq!(rows_after, kept);
}

/// README ("Configuration", `--inbox-cache-entries`): 0 turns Users' memory of its answers
/// off, so the replays of keys this very users-svc executed are each read from the inbox
/// table (with the memory on, `metrics_of_each_process_move_as_work_is_done` sees the same
/// three replays answered from memory).
async fn an_inbox_cache_of_no_entries_reads_every_replay_from_the_table(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack
        .restart_users_with(
            None,
            &[
                "--inbox-cache-entries",
                "0",
                "--metrics-addr",
                "127.0.0.1:0",
            ],
        )
        .await;
    stack.create_students(0..3).await;
    stack.wait_until_all_linked(3).await;
    let replay = stack.relay_command(&["replay", "--all"]);
    assert_eq!(replay.status.code(), Some(0), "{replay:?}");
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    assert_eq!(
        (
            sample(
                &users,
                "inbox_requests_total",
                &[("rpc", "CreateUser"), ("result", "replayed")]
            ),
            sample(&users, "inbox_answers_from_memory_total", &[]),
        ),
        (3.0, 0.0),
        "{users}"
    );
}

/// `relay audit` looks users up 16 at a time; a Users that takes one call at a time sheds
/// most of them, which is no answer about the user: each is asked again after Users' wait,
/// and forty linked students audit clean.
async fn an_audit_asks_again_for_the_lookups_users_sheds(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..40).await;
    stack.wait_until_all_linked(40).await;
    stack
        .restart_users_with(
            None,
            &[
                "--max-concurrent-requests",
                "1",
                "--metrics-addr",
                "127.0.0.1:0",
            ],
        )
        .await;
    stack.assert_audit_clean(40);
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    let shed = sample(
        &users,
        "grpc_server_handled_total",
        &[
            ("grpc_method", "ListUsers"),
            ("grpc_code", "RESOURCE_EXHAUSTED"),
        ],
    );
    assert!(
        shed > 0.0,
        "Users shed some of the audit's lookups:\n{users}"
    );
}

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
    // Someone else with student 0's document number: refused by the database inside the
    // writer, so it writes nothing and must not count as a commit.
    let taken = stack
        .student_client()
        .create_student(CreateStudentRequest {
            email: "someone.else@example.edu".into(),
            ..student_request(0)
        })
        .await
        .expect_err("a taken document number is refused");
    assert_eq!(taken.code(), Code::AlreadyExists);
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
            "grpc_server_handled_total",
            &create_student("ALREADY_EXISTS")
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
        5.0,
        "{student}"
    );

    // student-svc's group commit: the three students written, in one to three
    // transactions, by path (a group only where requests overlapped); the refused one
    // wrote nothing and is in neither count.
    let paths = ["alone", "together", "each"];
    let committed: f64 = paths
        .iter()
        .map(|path| {
            sample(
                &student,
                "student_create_committed_total",
                &[("path", path)],
            )
        })
        .sum();
    let commits: f64 = paths
        .iter()
        .map(|path| sample(&student, "student_create_commits_total", &[("path", path)]))
        .sum();
    assert_eq!(committed, 3.0, "{student}");
    assert!((1.0..=3.0).contains(&commits), "{student}");

    // users-svc: three users executed through the inbox, in one to three calls (rows the
    // relay finds waiting together share a CreateUsers call).
    let users = scrape(users_metrics).await;
    let calls = |method| {
        sample(
            &users,
            "grpc_server_handled_total",
            &[
                ("grpc_service", "users.v1.UsersService"),
                ("grpc_method", method),
                ("grpc_code", "OK"),
            ],
        )
    };
    let calls_served = calls("CreateUser") + calls("CreateUsers");
    assert!((1.0..=3.0).contains(&calls_served), "{users}");
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

    // relay: three rows linked, each call Users served and each row's latency observed, and the
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
        calls_served,
        "{relay}"
    );
    assert_eq!(
        sample(&relay, "outbox_link_latency_seconds_count", &[]),
        3.0,
        "{relay}"
    );
    // Each link took some time: a latency stuck at 0 would still count three.
    assert!(
        sample(&relay, "outbox_link_latency_seconds_sum", &[]) > 0.0,
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
    // No call was shed: the relay may still send its whole --concurrency at once.
    assert_eq!(
        sample(&relay, "relay_in_flight_limit", &[]),
        f64::from(relay::RunConfig::default().concurrency),
        "{relay}"
    );
    // Its wake-ups never lost, and the counter there to say so from the start.
    assert_eq!(gauge(&relay, "relay_wakeups_listening"), 1.0, "{relay}");
    assert_eq!(gauge(&relay, "relay_wakeup_losses_total"), 0.0, "{relay}");
    // The three answers were recorded in finalize batches, none of them row by row.
    let batches = |path| sample(&relay, "relay_finalize_batches_total", &[("path", path)]);
    assert!(batches("alone") + batches("set") >= 1.0, "{relay}");
    assert_eq!(batches("row_by_row"), 0.0, "{relay}");

    // A replay is answered from the inbox, and counted so: here from the server's memory of
    // the answers it saved itself, with no read of the table.
    assert_eq!(
        sample(&users, "inbox_answers_from_memory_total", &[]),
        0.0,
        "{users}"
    );
    let replay = stack.relay_command(&["replay", "--all"]);
    assert_eq!(replay.status.code(), Some(0));
    let users = scrape(users_metrics).await;
    assert_eq!(
        sample(&users, "inbox_requests_total", &inbox("replayed")),
        3.0,
        "{users}"
    );
    assert_eq!(
        sample(&users, "inbox_answers_from_memory_total", &[]),
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
    // export (SQLite's write lock has no PostgreSQL counterpart: only SQLite exports it;
    // the span counts need a collector named, and `spans_the_collector_did_not_take_are_counted`
    // checks them in its scrapes), or a label Prometheus gives every series it scrapes.
    const TARGET_LABELS: [&str; 2] = ["job", "instance"];
    let scrapes = [&student, &users, &relay];
    let exported: BTreeSet<String> = scrapes.iter().flat_map(|s| exported_names(s)).collect();
    let labels: BTreeSet<String> = scrapes.iter().flat_map(|s| label_names(s)).collect();
    let expressions = ops_expressions();
    assert!(expressions.len() >= 9, "{expressions:?}");
    for expr in &expressions {
        for name in promql_names(expr) {
            if TARGET_LABELS.contains(&name.as_str())
                || (backend == Backend::Postgres && name == platform::db::SQLITE_WRITE_LOCK_WAITS)
                || WITH_A_COLLECTOR.contains(&name.as_str())
            {
                continue;
            }
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

/// The metrics the alert rules fire on (`ops/alerts.yml`), made to move the way an incident
/// moves them: Users down (`OutboxLagging`: the oldest pending row ages, deliveries are
/// retried), a rejected row with a change behind it (`OutboxRowsFailed`,
/// `OutboxRowsBlocked`, a `failed` delivery), and a client reusing a key
/// (`InboxKeyReused`).
async fn what_the_alerts_watch_moves_when_deliveries_go_wrong(backend: Backend) {
    let Some(mut stack) = Stack::start_with_metrics(backend).await else {
        return;
    };
    let relay_metrics = stack.metrics_addr("relay-0").await;
    let relay_sample = |name: &'static str, labels: &'static [(&'static str, &'static str)]| async move {
        sample(&scrape(relay_metrics).await, name, labels)
    };
    // Someone already has student 0's document number in Users.
    stack
        .users_client()
        .create_user(conflicting_user_request(0))
        .await
        .expect("the other user");

    // Users down: student 1's row waits and ages, its deliveries are retried.
    stack.kill_users();
    stack.create_students(1..2).await;
    eventually("the oldest pending row to age", LINK_DEADLINE, || async {
        let age = relay_sample("outbox_oldest_pending_age_seconds", &[]).await;
        (age >= 1.0).then_some(())
    })
    .await;
    let retried = &[("effect", "create-user"), ("outcome", "retried")];
    assert!(relay_sample("relay_deliveries_total", retried).await >= 1.0);
    let status = stack.relay_command(&["status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    let age: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("oldest_pending_age_seconds "))
        .and_then(|age| age.parse().ok())
        .unwrap_or_else(|| panic!("no age in {stdout}"));
    assert!(age >= 1, "{stdout}");

    // Users back: the row is linked and the age falls back to 0.
    stack
        .restart_users_with(None, &["--metrics-addr", "127.0.0.1:0"])
        .await;
    let users_metrics = stack.metrics_addr("users-svc").await;
    stack.wait_until_all_linked(1).await;
    eventually("the age to fall back to 0", LINK_DEADLINE, || async {
        (relay_sample("outbox_oldest_pending_age_seconds", &[]).await == 0.0).then_some(())
    })
    .await;

    // Student 0 is refused its user for good, and its rename waits behind that.
    let refused = stack.create_students(0..1).await.remove(0);
    eventually("student 0's row to fail", LINK_DEADLINE, || async {
        let failed = &[("effect", "create-user"), ("outcome", "failed")];
        (relay_sample("relay_deliveries_total", failed).await == 1.0).then_some(())
    })
    .await;
    stack.rename_student(&refused, "Renamed").await;
    eventually(
        "the gauges to show it failed and blocked",
        LINK_DEADLINE,
        || async {
            let failed = relay_sample("outbox_rows", &[("status", "failed")]).await;
            let blocked = relay_sample("outbox_rows", &[("status", "blocked")]).await;
            (failed == 1.0 && blocked == 1.0).then_some(())
        },
    )
    .await;

    // A client sends a key again with other fields.
    let reused = stack
        .users_client()
        .create_user(CreateUserRequest {
            email: "someone.new@example.edu".into(),
            ..conflicting_user_request(0)
        })
        .await
        .expect_err("the key was used for another request");
    assert_eq!(reused.code(), Code::FailedPrecondition);
    let users = scrape(users_metrics).await;
    assert_eq!(
        sample(
            &users,
            "inbox_requests_total",
            &[("rpc", "CreateUser"), ("result", "key_reused")]
        ),
        1.0,
        "{users}"
    );
    assert_eq!(
        sample(
            &users,
            "users_rejected_total",
            &[("reason", "IDEMPOTENCY_KEY_REUSED")]
        ),
        1.0,
        "{users}"
    );
    // Student 0's refusal was a rejection Users executed and saved: counted by its reason.
    assert_eq!(
        sample(
            &users,
            "users_rejected_total",
            &[("reason", "DOCUMENT_NUMBER_TAKEN")]
        ),
        1.0,
        "{users}"
    );

    // Every series `ops/alerts.test.yml` feeds the rules is one these binaries export, down
    // to its label values: a value no binary sends (once `outcome="delivered"`) tests a
    // rule against a series that never exists. gRPC codes may be any of gRPC's; two
    // values are staged by tests of their own, which read them in a real scrape:
    // `result="expired"` (`retention_purges_only_what_is_safe_and_users_refuses_keys_past_its_horizon`)
    // and `reason="UNAUTHENTICATED"` (`security::a_token_rotation_under_a_pending_backlog_fails_no_row`).
    const STAGED_ELSEWHERE: [(&str, &str, &str); 2] = [
        ("inbox_requests_total", "result", "expired"),
        ("users_rejected_total", "reason", "UNAUTHENTICATED"),
    ];
    let scrapes = [
        scrape(stack.metrics_addr("student-svc").await).await,
        users,
        scrape(relay_metrics).await,
    ];
    for (name, labels) in alert_test_series() {
        if (backend == Backend::Postgres && name == platform::db::SQLITE_WRITE_LOCK_WAITS)
            || WITH_A_COLLECTOR.contains(&name.as_str())
        {
            continue;
        }
        assert!(
            scrapes.iter().any(|s| exported_names(s).contains(&name)),
            "ops/alerts.test.yml feeds {name}, which no binary exports"
        );
        for (key, value) in &labels {
            let known = if key == "grpc_code" {
                (0..=16).any(|n| platform::status::code_name(Code::from(n)) == value)
            } else {
                STAGED_ELSEWHERE.contains(&(name.as_str(), key.as_str(), value.as_str()))
                    || scrapes
                        .iter()
                        .any(|s| has_label_value(s, &name, key, value))
            };
            assert!(
                known,
                "ops/alerts.test.yml feeds {name}{{{key}=\"{value}\"}}, which no binary exported: {:?}",
                scrapes
                    .iter()
                    .flat_map(|s| s.lines())
                    .filter(|line| line.starts_with(&format!("{name}{{")))
                    .collect::<Vec<_>>()
            );
        }
    }
}

/// SQLite has one write lock per file, which student-svc and the relays share: a writer
/// that finds it taken pauses 1 ms and tries again (`platform::db`'s busy handler), and
/// `sqlite_write_lock_waits_total` counts the pauses, so an operator sees how contended the
/// file is. Here the test holds the Student DB's lock: CreateStudent waits, counted, and
/// is written once the lock is free. PostgreSQL has no such lock: no process exports it.
async fn waits_for_sqlites_write_lock_are_counted(backend: Backend) {
    let Some(mut stack) = Stack::start_with_metrics(backend).await else {
        return;
    };
    let student_metrics = stack.metrics_addr("student-svc").await;
    let users_metrics = stack.metrics_addr("users-svc").await;
    let relay_metrics = stack.metrics_addr("relay-0").await;
    const WAITS: &str = "sqlite_write_lock_waits_total";

    // On SQLite an IMMEDIATE transaction: it holds the write lock until it ends.
    let lock = platform::db::begin_write(&stack.student_db)
        .await
        .expect("begin");
    let mut client = stack.student_client();
    let create = tokio::spawn(async move { client.create_student(student_request(0)).await });
    if backend == Backend::Sqlite {
        eventually(
            "student-svc pausing for the lock",
            LINK_DEADLINE,
            || async { (sample(&scrape(student_metrics).await, WAITS, &[]) > 0.0).then_some(()) },
        )
        .await;
        assert!(
            !create.is_finished(),
            "CreateStudent waits while the lock is held"
        );
    }
    lock.rollback().await.expect("lock released");
    create
        .await
        .expect("task")
        .expect("created once the lock is free");
    stack.wait_until_all_linked(1).await;
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 1).await;

    for (name, addr) in [
        ("student-svc", student_metrics),
        ("users-svc", users_metrics),
        ("relay", relay_metrics),
    ] {
        let text = scrape(addr).await;
        match backend {
            Backend::Sqlite if name == "student-svc" => {
                assert!(sample(&text, WAITS, &[]) >= 1.0, "{text}")
            }
            // Exported from the start, at 0 if nothing waited: `rate()` sees the first pause.
            Backend::Sqlite => assert!(exported_names(&text).contains(WAITS), "{name}: {text}"),
            Backend::Postgres => assert!(!text.contains(WAITS), "{name}: {text}"),
        }
    }
}

/// The Student DB restored from a backup taken with one row still pending: the relay
/// delivers it again under its key and Users answers from its inbox (the same user, none
/// created twice). What the backup lost, the audit names: a user of a student that is gone,
/// and a user at a version its student no longer has, whose student's next change Users
/// then ignores, until the student's version passes the user's.
async fn a_student_db_restored_from_an_older_backup_creates_no_user_twice_and_the_audit_names_the_rest(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..2).await;
    stack.wait_until_all_linked(2).await;
    stack.kill_relays();
    let pending = stack.create_students(2..3).await.remove(0);
    let backup = (
        students::Entity::find()
            .all(&stack.student_db)
            .await
            .expect("students"),
        stack.outbox_rows().await,
    );

    // After the backup: student 2 linked, student 0 renamed, student 3 created.
    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(3).await;
    assert_eq!(stack.rename_student(&ids[0], "Lost").await, 2);
    let gone = stack.create_students(3..4).await.remove(0);
    stack.wait_until_all_linked(4).await;
    stack.wait_until_all_synced(4).await;
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
    let link = |id: &str| links[&Uuid::parse_str(id).expect("uuid")];

    // The restore: the Student DB as the backup has it.
    stack.kill_relays();
    outbox::Entity::delete_many()
        .exec(&stack.student_db)
        .await
        .expect("empty the outbox");
    students::Entity::delete_many()
        .exec(&stack.student_db)
        .await
        .expect("empty students");
    let (students_then, rows_then) = backup;
    students::Entity::insert_many(students_then.into_iter().map(students::ActiveModel::from))
        .exec(&stack.student_db)
        .await
        .expect("restore students");
    outbox::Entity::insert_many(rows_then.into_iter().map(outbox::ActiveModel::from))
        .exec(&stack.student_db)
        .await
        .expect("restore the outbox");

    // Student 2's row, pending again under its key, links the same user.
    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(3).await;
    let relinked: Vec<(Uuid, Option<Uuid>)> = students::Entity::find()
        .order_by_asc(students::Column::Id)
        .all(&stack.student_db)
        .await
        .expect("students")
        .into_iter()
        .map(|student| (student.id, student.user_id))
        .collect();
    let mut expected: Vec<(Uuid, Option<Uuid>)> = [&ids[0], &ids[1], &pending]
        .into_iter()
        .map(|id| (Uuid::parse_str(id).expect("uuid"), Some(link(id))))
        .collect();
    expected.sort();
    assert_eq!(relinked, expected, "each student linked to the user it had");
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await.0,
        4,
        "no user created twice"
    );

    let ahead = |version: u64| {
        format!(
            "student {}: its user {} in Users is at version 2, ahead of the student's version \
             {version}: the Student DB went back (an older backup restored?), and Users ignores \
             the student's changes until its version passes 2",
            ids[0],
            link(&ids[0])
        )
    };
    let orphan = user_of_no_student(&link(&gone).to_string(), &gone);
    stack.assert_audit_finds(3, &[ahead(1), orphan.clone()]);

    // Student 0's next change is version 2 again: Users holds a version 2 already, so it
    // ignores it, and the audit sees the user differ from the student.
    assert_eq!(stack.rename_student(&ids[0], "Again").await, 2);
    stack.wait_until_all_synced(3).await;
    let differs = format!(
        "student {}: its user {} in Users differs from the student at version 2: first_name",
        ids[0],
        link(&ids[0])
    );
    stack.assert_audit_finds(3, &[differs, orphan]);
    // The repair: a change past the user's version, and the orphan disabled.
    assert_eq!(stack.rename_student(&ids[0], "Final").await, 3);
    stack.wait_until_all_synced(3).await;
    stack
        .users_client()
        .disable_user(proto::users::v1::DisableUserRequest {
            idempotency_key: "disable-the-orphan".into(),
            student_id: gone.clone(),
            source_version: 2,
            user_id: link(&gone).to_string(),
        })
        .await
        .expect("the orphan disabled");
    stack.assert_audit_clean(3);
    let user = stored_user(&stack.users_db, link(&ids[0])).await;
    assert_eq!(
        (user.first_name.as_str(), user.source_version),
        ("Final", 3)
    );
}

/// The Users DB restored from an older backup, as the restore leaves it (user and inbox
/// rows alike): student 0's user gone (created after the backup), student 1's user back at
/// version 2 (renamed again after it), student 4's back at version 1 with its rename's row
/// purged from the Student DB since; and student 2's user gone but its key still in the
/// inbox (a hand deletion, no restore). The audit names the four; `relay resend` (relays
/// stopped, so that what it writes can be read before it is sent) sends student 0's and 1's
/// rows again with their keys, and refuses the others, a student Users lost nothing of, and
/// one with a row in flight. Then student 0's user is created again and linked, student
/// 1's rename applied again.
async fn after_a_users_db_restore_resend_gives_users_back_what_it_lost(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids = stack.create_students(0..5).await;
    stack.wait_until_all_linked(5).await;
    assert_eq!(stack.rename_student(&ids[0], "Renamed").await, 2);
    assert_eq!(stack.rename_student(&ids[1], "Middle").await, 2);
    assert_eq!(stack.rename_student(&ids[1], "Renamed").await, 3);
    assert_eq!(stack.rename_student(&ids[4], "Renamed").await, 2);
    stack.wait_until_all_synced(5).await;
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 5).await;
    let link = |n: usize| links[&Uuid::parse_str(&ids[n]).expect("uuid")];
    let rows = stack.outbox_rows().await;
    let rows_of = |n: usize| -> Vec<&outbox::Model> {
        rows.iter()
            .filter(|row| row.aggregate_id.to_string() == ids[n])
            .collect()
    };
    let forget = |keys: Vec<String>| {
        users_svc::entity::inbox::Entity::delete_many()
            .filter(users_svc::entity::inbox::Column::IdempotencyKey.is_in(keys))
            .exec(&stack.users_db)
    };
    let set_back = |n: usize, first_name: &'static str, version: i64| {
        users::Entity::update_many()
            .col_expr(users::Column::FirstName, Expr::value(first_name))
            .col_expr(users::Column::SourceVersion, Expr::value(version))
            .filter(users::Column::Id.eq(link(n)))
            .exec(&stack.users_db)
    };

    // The restore (and, for student 2, a hand deletion; for student 4, a purge since).
    for n in [0, 2] {
        users::Entity::delete_by_id(link(n))
            .exec(&stack.users_db)
            .await
            .expect("a user the backup lacks");
    }
    let keys_of = |n: usize, from: usize| -> Vec<String> {
        rows_of(n)[from..]
            .iter()
            .map(|row| row.idempotency_key.clone())
            .collect()
    };
    forget(keys_of(0, 0)).await.expect("student 0's keys");
    set_back(1, "Middle", 2).await.expect("student 1's user");
    forget(keys_of(1, 2))
        .await
        .expect("student 1's last rename");
    set_back(4, "Ana4", 1).await.expect("student 4's user");
    forget(keys_of(4, 1)).await.expect("student 4's rename");
    outbox::Entity::delete_by_id(rows_of(4)[1].id)
        .exec(&stack.student_db)
        .await
        .expect("student 4's rename row purged");
    // A restore restarts users-svc: its memory of recent answers goes with the old history.
    stack.restart_users(None).await;

    let lost = |n: usize| {
        format!(
            "student {}: linked to user {}, which Users does not have",
            ids[n],
            link(n)
        )
    };
    let behind = |n: usize, version: u64| {
        format!(
            "student {}: its user {} in Users is at version {}, behind version {version} that \
             Users applied: the Users DB went back (an older backup restored?), and the \
             student's changes since are not in it",
            ids[n],
            link(n),
            version - 1
        )
    };
    stack.assert_audit_finds(5, &[lost(0), behind(1, 3), lost(2), behind(4, 2)]);

    stack.kill_relays();
    let resend = |n: usize| {
        let output = stack.relay_command(&["resend", "--student", &ids[n]]);
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let refused = |n: usize, why: &str| format!("student {}: {why}; nothing changed\n", ids[n]);
    let resent_zero = format!(
        "student {}: user {} is not in Users: link cleared; requeued with their keys: rows {} \
         {}\n",
        ids[0],
        link(0),
        rows_of(0)[0].id,
        rows_of(0)[1].id
    );
    let busy = "a row of it waits or is being delivered; resend once it is delivered";
    let in_inbox = format!(
        "Users' inbox still answers the key of row {} (user {}): that is no restore, and sent \
         again the row would be answered, not run",
        rows_of(2)[0].id,
        link(2)
    );
    let purged = "no delivered row is left of versions 2 (relay purge deletes them), so nothing \
                  can change it again as it was";
    // Student 1 with its last rename in flight (marked so by hand here: a relay's claim
    // that has not ended) is refused for now.
    let mark = |status: OutboxStatus| {
        outbox::Entity::update_many()
            .col_expr(outbox::Column::Status, Expr::value(status))
            .filter(outbox::Column::Id.eq(rows_of(1)[2].id))
            .exec(&stack.student_db)
    };
    mark(OutboxStatus::Processing).await.expect("in flight");
    let all = stack.relay_command(&["resend", "--all"]);
    assert_eq!(
        (
            all.status.code(),
            String::from_utf8_lossy(&all.stdout).into_owned()
        ),
        (
            Some(1),
            format!(
                "{resent_zero}{}{}{}resent=1 refused=3 unchanged=1\n",
                refused(1, busy),
                refused(2, &in_inbox),
                refused(4, purged)
            )
        )
    );
    mark(OutboxStatus::Done).await.expect("done again");
    assert_eq!(
        resend(1),
        (
            Some(0),
            format!(
                "student {}: user {} in Users is at version 2, behind version 3 that Users had \
                 applied; requeued with their keys: rows {}\n",
                ids[1],
                link(1),
                rows_of(1)[2].id
            )
        )
    );
    // Student 0 was resent: unlinked until its create-user row links the user again, it
    // has nothing more to resend.
    assert_eq!(
        resend(0),
        (
            Some(1),
            format!(
                "student {}: not a linked student; nothing Users could have lost\n",
                ids[0]
            )
        )
    );
    let nothing_lost = format!(
        "user {} in Users is at version 1, not behind version 1 that Users had applied: Users \
         lost nothing of it",
        link(3)
    );
    assert_eq!(resend(3), (Some(1), refused(3, &nothing_lost)));
    // What the resends wrote, before any of it is sent: student 0 unlinked with both rows
    // pending, student 1 recorded at its user's version with its last rename pending.
    let student_db = stack.student_db.clone();
    let student = |n: usize| {
        let (id, db) = (Uuid::parse_str(&ids[n]).expect("uuid"), &student_db);
        async move {
            students::Entity::find_by_id(id)
                .one(db)
                .await
                .expect("students")
                .expect("the student")
        }
    };
    let (zero, one) = (student(0).await, student(1).await);
    assert_eq!(
        (
            zero.user_id,
            zero.synced_version,
            one.user_id,
            one.synced_version
        ),
        (None, 0, Some(link(1)), 2)
    );
    let pending: Vec<outbox::Model> = stack
        .outbox_rows()
        .await
        .into_iter()
        .filter(|row| row.status == OutboxStatus::Pending)
        .collect();
    let sent_before = [rows_of(0)[0], rows_of(0)[1], rows_of(1)[2]];
    assert_eq!(
        pending.iter().map(|row| row.id).collect::<Vec<_>>(),
        sent_before.iter().map(|row| row.id).collect::<Vec<_>>()
    );
    for (row, before) in pending.iter().zip(sent_before) {
        // The same key, dated now: younger than the delivery that made the row done.
        assert_eq!(row.idempotency_key, before.idempotency_key);
        let done_at = before.processed_at.expect("delivered");
        assert!(row.key_created_at.is_some_and(|at| at > done_at), "{row:?}");
    }
    // A second --all finds nothing more to send: student 0 is unlinked, 1 is recorded at
    // its user's version.
    let again = stack.relay_command(&["resend", "--all"]);
    assert_eq!(
        (
            again.status.code(),
            String::from_utf8_lossy(&again.stdout).into_owned()
        ),
        (
            Some(1),
            format!(
                "{}{}resent=0 refused=2 unchanged=2\n",
                refused(2, &in_inbox),
                refused(4, purged)
            )
        )
    );

    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(5).await;
    stack.wait_until_all_synced(5).await;
    let created_again = student(0).await.user_id.expect("linked again");
    assert_ne!(created_again, link(0), "a new user: the old one is gone");
    for (user_id, n, version) in [(created_again, 0, 2), (link(1), 1, 3)] {
        let user = stored_user(&stack.users_db, user_id).await;
        assert_eq!(
            (
                user.student_id.to_string(),
                user.first_name.as_str(),
                user.source_version
            ),
            (ids[n].clone(), "Renamed", version)
        );
    }
    // Only the refused ones are still named.
    stack.assert_audit_finds(5, &[lost(2), behind(4, 2)]);
}

async fn audit_reports_each_disagreement_between_the_databases(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let ids: Vec<Uuid> = stack
        .create_students(0..6)
        .await
        .iter()
        .map(|id| id.parse().expect("uuid"))
        .collect();
    stack.wait_until_all_linked(6).await;
    // Student 5 renamed, and Users has applied it.
    assert_eq!(
        stack.rename_student(&ids[5].to_string(), "Renamed").await,
        2
    );
    stack.wait_until_all_synced(6).await;
    stack.assert_audit_clean(6);

    // Break the agreement on purpose, behind the services' backs.
    let links =
        assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 6).await;
    let link = |n: usize| links[&ids[n]];
    let set_link = |n: usize, user: Option<Uuid>| {
        students::Entity::update_many()
            .col_expr(students::Column::UserId, Expr::value(user))
            .filter(students::Column::Id.eq(ids[n]))
            .exec(&stack.student_db)
    };
    set_link(0, None).await.expect("unlink student 0");
    set_link(1, Some(link(2)))
        .await
        .expect("link student 1 to student 2's user");
    users::Entity::delete_by_id(link(3))
        .exec(&stack.users_db)
        .await
        .expect("delete student 3's user");
    users::Entity::update_many()
        .col_expr(users::Column::FirstName, Expr::value("Changed"))
        .col_expr(users::Column::Email, Expr::value("changed@example.edu"))
        .filter(users::Column::Id.eq(link(4)))
        .exec(&stack.users_db)
        .await
        .expect("change student 4's user by hand");
    // Student 5's user as an older backup of the Users DB has it: before the rename.
    users::Entity::update_many()
        .col_expr(users::Column::FirstName, Expr::value("Ana5"))
        .col_expr(users::Column::SourceVersion, Expr::value(1))
        .filter(users::Column::Id.eq(link(5)))
        .exec(&stack.users_db)
        .await
        .expect("set student 5's user back");

    // More students than the audit reads in one page (500), all older than the four, so
    // their problems are on its second page: students written straight to the table, not
    // yet linked and with no row (nothing to disagree about).
    let hour_ago = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    insert_unlinked_students(&stack.student_db, 600, hour_ago).await;
    // A user of a student the Student DB does not have (made by hand here; the direct
    // flow's orphan, or a student restored away), on the audit's second page of Users'
    // users: the first holds 600 disabled ones of no student, lowest ids, no problem.
    let orphan = stack
        .users_client()
        .create_user(conflicting_user_request(9))
        .await
        .expect("a user of no student")
        .into_inner()
        .user_id;
    let orphans_student = stored_user(&stack.users_db, Uuid::parse_str(&orphan).expect("uuid"))
        .await
        .student_id;
    insert_users_of_no_student(&stack.users_db, (1..=600).map(Uuid::from_u128), false).await;

    let rows = stack.outbox_rows().await;
    let row_of = |n: usize| {
        rows.iter()
            .find(|row| row.aggregate_id == ids[n])
            .expect("a row per student")
    };
    let audit = stack.relay_command(&["audit"]);
    let stdout = String::from_utf8_lossy(&audit.stdout);
    assert_eq!(audit.status.code(), Some(1), "{stdout}");
    let (first, second) = if ids[1] < ids[2] {
        (ids[1], ids[2])
    } else {
        (ids[2], ids[1])
    };
    let mut expected = vec![
        format!("user {} is linked to 2 students: {first} {second}", link(2)),
        format!(
            "student {}: outbox row {} (create-user) is done with user {}, but the student is not linked",
            ids[0],
            row_of(0).id,
            link(0)
        ),
        format!(
            "student {}: outbox row {} (create-user) is done with user {}, but the student is linked to {}",
            ids[1],
            row_of(1).id,
            link(1),
            link(2)
        ),
        format!(
            "student {}: linked to user {}, which Users says belongs to student {}",
            ids[1],
            link(2),
            ids[2]
        ),
        format!(
            "student {}: linked to user {}, which Users does not have",
            ids[3],
            link(3)
        ),
        // The user Users created for student 1 is still its, but not its link.
        format!(
            "student {}: Users also holds enabled user {} for it, which it is not linked to",
            ids[1],
            link(1)
        ),
        format!(
            "user {orphan}: Users holds it, enabled, for student {orphans_student}, which the \
             Student DB does not have"
        ),
    ];
    expected.push(format!(
        "student {}: its user {} in Users differs from the student at version 1: first_name, email",
        ids[4],
        link(4)
    ));
    expected.push(format!(
        "student {}: its user {} in Users is at version 1, behind version 2 that Users applied: \
         the Users DB went back (an older backup restored?), and the student's changes since \
         are not in it",
        ids[5],
        link(5)
    ));
    let mut lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert_eq!(
        lines.pop().as_deref(),
        Some("checked=606 problems=9"),
        "{stdout}"
    );
    lines.sort();
    expected.sort();
    assert_eq!(lines, expected);

    // `relay replay` sees the wrong link too: Users answers student 1's key with the user
    // it created for student 1, not the one the student is now linked to. It asks and
    // reports; it writes nothing to the Student DB.
    let student_db = || async {
        let students = students::Entity::find()
            .order_by_asc(students::Column::Id)
            .all(&stack.student_db)
            .await
            .expect("students");
        (students, stack.outbox_rows().await)
    };
    let before = student_db().await;
    let replay = stack.relay_command(&["replay", "--student", &ids[1].to_string()]);
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(1), "{stdout}");
    assert_eq!(
        stdout,
        format!(
            "key={} effect=create-user student={} user={} from_inbox=true matches_link=false\n\
             replayed=1 matched=0 mismatched=1 errors=0\n",
            row_of(1).idempotency_key,
            ids[1],
            link(1)
        )
    );
    let all = stack.relay_command(&["replay", "--all"]);
    let stdout = String::from_utf8_lossy(&all.stdout);
    assert_eq!(all.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.ends_with("replayed=7 matched=5 mismatched=2 errors=0\n"),
        "{stdout}"
    );
    assert_eq!(
        student_db().await,
        before,
        "a replay writes nothing to the Student DB"
    );

    // Users not answering is an error, not a verdict.
    stack.kill_users();
    let audit = stack.relay_command(&["audit"]);
    let stderr = String::from_utf8_lossy(&audit.stderr);
    assert_eq!(audit.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot ask Users about student "),
        "{stderr}"
    );
}

/// The horizon guard holds for rows sent together too (by default a claim's create-user
/// rows go in CreateUsers calls of up to 16): each item carries its key's age, and three rows whose keys are older
/// than Users' inbox retention are each refused `DELIVERY_EXPIRED` and failed as
/// `expired` at their first attempt, with nothing executed.
async fn rows_past_the_horizon_sent_together_are_each_refused(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack
        .restart_users_with(
            None,
            &["--inbox-retention", "2s", "--metrics-addr", "127.0.0.1:0"],
        )
        .await;
    stack.create_students(0..3).await;
    let youngest = stack
        .outbox_rows()
        .await
        .iter()
        .map(|row| row.key_issued_at())
        .max()
        .expect("three rows");
    wait_past_a_two_second_retention(youngest).await;

    stack.start_relay_sending_together();
    let rows = eventually("every row to be finished", LINK_DEADLINE, || async {
        let rows = stack.outbox_rows().await;
        rows.iter()
            .all(|row| matches!(row.status, OutboxStatus::Failed | OutboxStatus::Done))
            .then_some(rows)
    })
    .await;
    for row in &rows {
        assert_eq!(
            (
                row.status,
                row.attempts,
                row.failure_kind,
                row.error_code.as_deref()
            ),
            (
                OutboxStatus::Failed,
                1,
                Some(FailureKind::Expired),
                Some("DELIVERY_EXPIRED")
            ),
            "row {}",
            row.id
        );
    }
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (0, 0),
        "nothing executed, nothing saved"
    );
    // The API says why: Users' reason, not "unreachable".
    let student = stack
        .student_client()
        .get_student(proto::student::v1::GetStudentRequest {
            id: rows[0].aggregate_id.to_string(),
        })
        .await
        .expect("found")
        .into_inner();
    assert_eq!(
        student.user_link_status(),
        proto::student::v1::UserLinkStatus::Failed
    );
    assert!(
        student.link_error.starts_with("DELIVERY_EXPIRED: "),
        "{}",
        student.link_error
    );
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    assert_eq!(
        sample(
            &users,
            "grpc_server_handled_total",
            &[("grpc_method", "CreateUsers"), ("grpc_code", "OK")],
        ),
        1.0,
        "the three rows went in one CreateUsers call: {users}"
    );
    assert!(
        !users.contains("grpc_method=\"CreateUser\""),
        "and none alone: {users}"
    );
    assert_eq!(
        sample(
            &users,
            "inbox_requests_total",
            &[("rpc", "CreateUser"), ("result", "expired")]
        ),
        3.0,
        "{users}"
    );
}

async fn retention_purges_only_what_is_safe_and_users_refuses_keys_past_its_horizon(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    // Users keeps keys for two seconds and says at start-up that this is short (its
    // first start, with the default 30 days, did not).
    const SHORT: &str = "the inbox retention is shorter than a relay's default retry window";
    assert_eq!(stack.log_of("users-svc").matches(SHORT).count(), 0);
    stack
        .restart_users_with(
            None,
            &[
                "--inbox-retention",
                "2s",
                "--inbox-purge-interval",
                "100ms",
                "--metrics-addr",
                "127.0.0.1:0",
            ],
        )
        .await;
    stack.wait_for_log_lines("users-svc", SHORT, 1).await;

    // Two students linked (done rows), one failed (rejected), one pending (no relay).
    stack.create_students(0..2).await;
    stack.wait_until_all_linked(2).await;
    let holder_request = conflicting_user_request(2);
    let holder = stack
        .users_client()
        .create_user(holder_request.clone())
        .await
        .expect("somebody else holds student 2's document number")
        .into_inner()
        .user_id;
    stack.create_students(2..3).await;
    let failed = eventually("student 2's row fails", LINK_DEADLINE, || async {
        let rows = stack.outbox_rows().await;
        rows.into_iter()
            .find(|row| row.status == OutboxStatus::Failed)
    })
    .await;
    stack.kill_relays();
    let waiting: Uuid = stack.create_students(3..4).await[0].parse().expect("uuid");

    // `relay purge` deletes the done rows once they are a second old, and nothing else.
    let kept = eventually("the done rows are purged", LINK_DEADLINE, || async {
        let purge = stack.relay_command(&["purge", "--retain-done", "1s"]);
        assert_eq!(purge.status.code(), Some(0), "{purge:?}");
        let rows = stack.outbox_rows().await;
        rows.iter()
            .all(|row| row.status != OutboxStatus::Done)
            .then_some(rows)
    })
    .await;
    let statuses: Vec<_> = kept.iter().map(|row| (row.id, row.status)).collect();
    let pending = kept
        .iter()
        .find(|row| row.aggregate_id == waiting)
        .expect("the waiting row is kept");
    assert_eq!(
        statuses,
        [
            (failed.id, OutboxStatus::Failed),
            (pending.id, OutboxStatus::Pending)
        ]
    );
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (4, 2));
    let purge = stack.relay_command(&["purge", "--retain-done", "1s"]);
    assert_eq!(String::from_utf8_lossy(&purge.stdout), "purged=0\n");

    // Users' schedule empties its inbox of keys over two seconds old; the users stay.
    eventually("the inbox is purged", LINK_DEADLINE, || async {
        (users_and_inbox_rows(&stack.users_db).await == (3, 0)).then_some(())
    })
    .await;

    // The waiting row's key is now older than Users' memory: delivered, it is refused,
    // not executed (Users cannot tell it from a purged key), and fails as expired.
    wait_past_a_two_second_retention(pending.key_issued_at()).await;
    stack.start_relay(None, &[]);
    let expired = eventually("the waiting row fails", LINK_DEADLINE, || async {
        let rows = stack.outbox_rows().await;
        rows.into_iter()
            .find(|row| row.id == pending.id && row.status == OutboxStatus::Failed)
    })
    .await;
    assert_eq!(
        (
            expired.attempts,
            expired.failure_kind,
            expired.error_code.as_deref()
        ),
        (1, Some(FailureKind::Expired), Some("DELIVERY_EXPIRED"))
    );
    assert_eq!(
        users_and_inbox_rows(&stack.users_db).await,
        (3, 0),
        "nothing executed, nothing saved"
    );
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    assert_eq!(
        sample(
            &users,
            "inbox_requests_total",
            &[("rpc", "CreateUser"), ("result", "expired")]
        ),
        1.0,
        "{users}"
    );
    assert_eq!(
        sample(
            &users,
            "users_rejected_total",
            &[("reason", "DELIVERY_EXPIRED")]
        ),
        1.0
    );

    // retry-failed says what --new-key will do, and does it only when told to.
    let advice = stack.relay_command(&["retry-failed", "--all"]);
    let stdout = String::from_utf8_lossy(&advice.stdout);
    assert_eq!(advice.status.code(), Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].ends_with("skipped: rejected; the same key gets the same answer, use --new-key"),
        "{stdout}"
    );
    assert_eq!(
        lines[1],
        format!(
            "id={} key={} skipped: expired; Users no longer keeps keys this old, so it cannot \
             tell whether this one ran. Use --new-key: it links the student's user if Users \
             holds one, and gives a new key if it holds none",
            expired.id, expired.idempotency_key
        )
    );
    assert_eq!(lines[2], "requeued=0 linked=0 skipped=2 errors=0");
    // Users holds no user of the student, so the old key created none: a new key.
    let expired_id = expired.id.to_string();
    let rekeyed = stack.relay_command(&["retry-failed", "--id", &expired_id, "--new-key"]);
    assert_eq!(rekeyed.status.code(), Some(0), "{rekeyed:?}");
    let row = stack
        .outbox_rows()
        .await
        .into_iter()
        .find(|row| row.id == expired.id)
        .expect("the row");
    assert_ne!(row.idempotency_key, expired.idempotency_key);
    assert_eq!(
        String::from_utf8_lossy(&rekeyed.stdout),
        format!(
            "id={} key={} requeued (new key; was {}): Users holds no user of student \
             {waiting}\nrequeued=1 linked=0 skipped=0 errors=0\n",
            expired.id, row.idempotency_key, expired.idempotency_key
        )
    );
    // Its question about the old key was a question, not a delivery: the expired count
    // (which pages) is still the one delivery's.
    let users = scrape(stack.metrics_addr("users-svc").await).await;
    let inbox = |result| {
        sample(
            &users,
            "inbox_requests_total",
            &[("rpc", "CreateUser"), ("result", result)],
        )
    };
    assert_eq!(
        (inbox("expired"), inbox("not_in_inbox")),
        (1.0, 1.0),
        "{users}"
    );
    // The new key is as young as the redrive, so Users executes it.
    stack.wait_until_all_linked(3).await;
    assert_eq!(users_and_inbox_rows(&stack.users_db).await.0, 4);
    // The one problem: the user holding student 2's number belongs to no student here.
    stack.assert_audit_finds(
        4,
        &[user_of_no_student(&holder, &holder_request.student_id)],
    );

    // `relay run` purges on its own schedule too: the row just delivered goes, the failed
    // one stays.
    stack.kill_relays();
    stack.start_relay(None, &["--retain-done", "1s", "--purge-interval", "100ms"]);
    let rows = eventually(
        "the relay's schedule purges the done row",
        LINK_DEADLINE,
        || async {
            let rows = stack.outbox_rows().await;
            (rows.len() == 1).then_some(rows)
        },
    )
    .await;
    assert_eq!(
        (rows[0].id, rows[0].status),
        (failed.id, OutboxStatus::Failed)
    );
}

/// `relay purge` while a row is in flight (claimed, its call not made yet: the relay is
/// held by a fail point and then frozen, so the purge surely runs inside that window): the
/// purge takes the old `done` rows and not the claimed one, even with a `processed_at`
/// far past the horizon (left by an earlier state, say): only its status keeps it. The
/// relay then delivers it, once.
async fn purge_leaves_a_row_in_flight_to_be_delivered_once(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.create_students(0..2).await;
    stack.wait_until_all_linked(2).await;
    stack.kill_relays();
    stack.create_students(2..3).await;
    let held = format!("{}=1*sleep(6000)", points::RELAY_AFTER_CLAIM);
    stack.start_relay(Some(&held), &["--lease", "300s"]);
    stack
        .wait_for_relay_log_lines("fail point: sleeping", 1)
        .await;
    stack.relays[0].signal(Signal::SIGSTOP).expect("SIGSTOP");
    let long_ago = chrono::Utc::now() - chrono::TimeDelta::days(30);
    outbox::Entity::update_many()
        .col_expr(outbox::Column::ProcessedAt, Expr::value(Some(long_ago)))
        .filter(outbox::Column::Status.eq(OutboxStatus::Processing))
        .exec(&stack.student_db)
        .await
        .expect("age the claimed row");

    let purge = stack.relay_command(&["purge", "--retain-done", "1ms"]);
    assert_eq!(
        (
            purge.status.code(),
            String::from_utf8_lossy(&purge.stdout).as_ref()
        ),
        (Some(0), "purged=2\n"),
        "{purge:?}"
    );
    let rows = stack.outbox_rows().await;
    let in_flight: Vec<_> = rows
        .iter()
        .map(|row| (row.status, row.attempts, row.locked_by.is_some()))
        .collect();
    assert_eq!(in_flight, [(OutboxStatus::Processing, 1, true)], "{rows:?}");

    stack.relays[0].signal(Signal::SIGCONT).expect("SIGCONT");
    stack.wait_until_all_linked(3).await;
    let rows = stack.outbox_rows().await;
    assert_eq!(
        rows.iter()
            .map(|row| (row.status, row.attempts))
            .collect::<Vec<_>>(),
        [(OutboxStatus::Done, 1)],
        "delivered by the claim the purge saw, not by a later one"
    );
    // One user and one key per student, each linked to its own user (the audit reads
    // every student against Users; purged rows are not needed for that), and no key
    // reached Users twice.
    assert_eq!(users_and_inbox_rows(&stack.users_db).await, (3, 3));
    stack.assert_audit_clean(3);
    assert_eq!(
        stack
            .log_of("users-svc")
            .matches("answered from the inbox")
            .count(),
        0
    );
}

/// README ("Retention": the indexes make both purges and the gauges cheap whatever the
/// history; "Metrics": `outbox_rows` counts through partial indexes, never the history).
/// Beside a history of 20,000 `done` rows (statistics gathered), 100 undelivered and 10
/// failed, 20,000 keys of changes that changed nothing, 20,000 inbox entries and 20,000
/// users, the plan of each statement the gauges run, of a purge batch of each table, and
/// of ListUsers by student (`users_student_id_idx`), finds its rows through the index named
/// for it and scans no table, nor any index but those partial ones.
async fn purges_and_gauges_find_their_rows_through_indexes_never_the_history(backend: Backend) {
    use platform::retention::PURGE_BATCH;

    let Some(app) = spawn_app(backend).await else {
        return;
    };
    write_history(&app.student_db, &app.users_db).await;
    let backend = app.student_db.get_database_backend();
    let horizon = chrono::Utc::now() - chrono::TimeDelta::days(1);
    let mut student_statements: Vec<(&str, &str, sea_orm::Statement)> =
        student_store::outbox::report_statements(backend)
            .into_iter()
            .map(|(name, statement)| {
                let index = match name {
                    "failed" => "outbox_failed",
                    _ => "outbox_claimable",
                };
                (name, index, statement)
            })
            .collect();
    assert_eq!(student_statements.len(), 5);
    student_statements.push((
        "outbox purge",
        "outbox_done_by_time",
        student_store::outbox::purge_done_batch(backend, horizon, PURGE_BATCH).build(backend),
    ));
    student_statements.push((
        "unchanged keys purge",
        "unchanged_keys_created_at",
        student_store::students::purge_unchanged_keys_batch(backend, horizon, PURGE_BATCH)
            .build(backend),
    ));
    let inbox_purge = (
        "inbox purge",
        "inbox_created_at",
        users_svc::retention::purge_batch(backend, horizon, PURGE_BATCH).build(backend),
    );
    // Not history, but a table that only grows: ListUsers by student (the audit's and
    // retry-failed's question, once per student) finds the student's users by index.
    let users_of_student = (
        "users of a student",
        "users_student_id_idx",
        sea_orm::QueryTrait::build(
            &users_svc::listing::users_of_student_query(uuid::Uuid::now_v7()),
            backend,
        ),
    );
    let checks = student_statements
        .into_iter()
        .map(|check| (&app.student_db, check))
        .chain([
            (&app.users_db, inbox_purge),
            (&app.users_db, users_of_student),
        ]);
    let mut wrong = Vec::new();
    for (db, (name, index, statement)) in checks {
        let plan = plan_of(db, statement).await;
        if !plan.iter().any(|step| step.contains(index)) {
            wrong.push(format!("{name}: not through {index}: {plan:#?}"));
        }
        let reads_a_whole_table_or_index = |step: &&String| match backend {
            DbBackend::Postgres => step.contains("Seq Scan"),
            // A SCAN walks a whole table or index; only a partial index holds no history.
            _ => {
                step.starts_with("SCAN ")
                    && ![
                        "outbox_claimable",
                        "outbox_failed",
                        "outbox_done_by_time",
                        "inbox_created_at",
                    ]
                    .iter()
                    .any(|partial| step.contains(&format!("INDEX {partial}")))
            }
        };
        let scans: Vec<&String> = plan.iter().filter(reads_a_whole_table_or_index).collect();
        if !scans.is_empty() {
            wrong.push(format!("{name}: {scans:?} in {plan:#?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The steps of `statement`'s plan: PostgreSQL's lines, or SQLite's `detail`s.
async fn plan_of(db: &sea_orm::DatabaseConnection, statement: sea_orm::Statement) -> Vec<String> {
    let postgres = db.get_database_backend() == DbBackend::Postgres;
    let explain = if postgres {
        "EXPLAIN (COSTS OFF)"
    } else {
        "EXPLAIN QUERY PLAN"
    };
    db.query_all_raw(explained(explain, statement))
        .await
        .expect("explain")
        .iter()
        .map(|row| {
            if postgres {
                row.try_get_by_index::<String>(0)
            } else {
                row.try_get::<String>("", "detail")
            }
            .expect("a step")
            .trim()
            .to_owned()
        })
        .collect()
}

/// An outbox with a history: 20,000 create-user rows `done` a year ago, 100 `pending`, 10
/// `failed`; 20,000 keys of changes that changed nothing, 20,000 inbox entries and 20,000
/// users, a year old. Statistics gathered on both databases.
async fn write_history(
    student_db: &sea_orm::DatabaseConnection,
    users_db: &sea_orm::DatabaseConnection,
) {
    let postgres = student_db.get_database_backend() == DbBackend::Postgres;
    let (series, uuid, key, then) = if postgres {
        (
            "generate_series(1, {count}) AS n(i)",
            "gen_random_uuid()",
            "gen_random_uuid()::text",
            "now() - interval '1 year'",
        )
    } else {
        (
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count}) \
             SELECT i FROM n)",
            "randomblob(16)",
            "lower(hex(randomblob(16)))",
            "'2025-01-01T00:00:00.000000+00:00'",
        )
    };
    for (count, status) in [(20_000, "done"), (100, "pending"), (10, "failed")] {
        let processed = if status == "pending" { "NULL" } else { then };
        let rows = series.replace("{count}", &count.to_string());
        student_db
            .execute_unprepared(&format!(
                "INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
                   idempotency_key, status, attempts, available_at, created_at, processed_at) \
                 SELECT {uuid}, 1, 'create-user', '{{}}', {key}, '{status}', 1, {then}, \
                   {then}, {processed} FROM {rows}"
            ))
            .await
            .expect("outbox rows");
    }
    let rows = series.replace("{count}", "20000");
    student_db
        .execute_unprepared(&format!(
            "INSERT INTO unchanged_keys (client_key, student_id, request_hash, created_at) \
             SELECT {key}, {uuid}, 'hash', {then} FROM {rows}"
        ))
        .await
        .expect("keys of changes that changed nothing");
    users_db
        .execute_unprepared(&format!(
            "INSERT INTO inbox (idempotency_key, request_hash, result, created_at) \
             SELECT {key}, 'hash', '{{}}', {then} FROM {rows}"
        ))
        .await
        .expect("inbox rows");
    users_db
        .execute_unprepared(&format!(
            "INSERT INTO users (id, email, first_name, last_name, document_number, student_id, \
               enabled, created_at, source_version) \
             SELECT {uuid}, 'a@example.edu', 'A', 'B', 'D' || i, {uuid}, true, {then}, 1 FROM {rows}"
        ))
        .await
        .expect("users");
    for db in [student_db, users_db] {
        db.execute_unprepared("ANALYZE").await.expect("statistics");
    }
}

/// Waits until a key issued at `issued_at` is older than a 2 s inbox retention, with half a
/// second to spare for the clocks of the test and the databases.
async fn wait_past_a_two_second_retention(issued_at: chrono::DateTime<chrono::Utc>) {
    eventually("the key to be past the horizon", LINK_DEADLINE, || async {
        (chrono::Utc::now() - issued_at > chrono::TimeDelta::milliseconds(2_500)).then_some(())
    })
    .await;
}

/// README ("Retention"): a CreateStudent key lives on the student, so a retry after
/// `relay purge` deleted the student's delivered outbox row still gets its student and
/// writes nothing. An UpdateStudent key lives on its outbox row: once that is purged, a
/// retry is a new call, refused (`VERSION_MISMATCH`) with an `expected_version` the student
/// has moved past, applied again with 0 (here undoing the later rename). The key of an
/// UpdateStudent that changed nothing is purged with the rows, by the same retention.
async fn student_client_keys_outlive_the_purge_only_where_their_record_does(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    let mut client = stack.student_client();
    let enrol = CreateStudentRequest {
        idempotency_key: Some("enrol-1".into()),
        ..student_request(1)
    };
    let id = client
        .create_student(enrol.clone())
        .await
        .expect("created")
        .into_inner()
        .id;
    let rename = |first_name: &str, key: &str, expected_version: u64| UpdateStudentRequest {
        id: id.clone(),
        first_name: first_name.into(),
        last_name: "Pérez".into(),
        email: "ana.perez.1@example.edu".into(),
        idempotency_key: Some(key.into()),
        expected_version,
    };
    client
        .update_student(rename("Renamed", "rename-1", 1))
        .await
        .expect("renamed");
    client
        .update_student(rename("Later", "rename-2", 2))
        .await
        .expect("renamed again");
    let unchanged = client
        .update_student(rename("Later", "same-1", 3))
        .await
        .expect("a change that changes nothing")
        .into_inner();
    assert_eq!(unchanged.version, 3);
    stack.wait_until_all_synced(1).await;
    // Three done rows and the key of the change that changed nothing.
    let purge = stack.relay_command(&["purge", "--retain-done", "1ms"]);
    assert_eq!(
        (
            purge.status.code(),
            String::from_utf8_lossy(&purge.stdout).as_ref()
        ),
        (Some(0), "purged=4\n"),
        "{purge:?}"
    );

    let again = client
        .create_student(enrol)
        .await
        .expect("the key still finds its student")
        .into_inner();
    assert_eq!((again.id.as_str(), again.version), (id.as_str(), 3));
    assert_eq!(students_and_outbox_rows(&stack.student_db).await, (1, 0));

    let status = client
        .update_student(rename("Renamed", "rename-1", 1))
        .await
        .expect_err("a new call at version 1");
    assert_eq!(
        (status.code(), platform::status::reason(&status).as_deref()),
        (Code::Aborted, Some("VERSION_MISMATCH")),
        "{status:?}"
    );
    let unconditional = client
        .update_student(rename("Renamed", "rename-1", 0))
        .await
        .expect("applied as a new call")
        .into_inner();
    assert_eq!(
        (unconditional.first_name.as_str(), unconditional.version),
        ("Renamed", 4)
    );
    // The key of the change that changed nothing went with the rows: a new call too.
    let status = client
        .update_student(rename("Later", "same-1", 3))
        .await
        .expect_err("a new call at version 3");
    assert_eq!(
        (status.code(), platform::status::reason(&status).as_deref()),
        (Code::Aborted, Some("VERSION_MISMATCH")),
        "{status:?}"
    );
}
