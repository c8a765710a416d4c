//! Claims, leases, attempts and shutdown, driven through the relay's library.

use std::{
    collections::HashSet,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use relay::{
    RunConfig, retry_failed,
    wakeup::{Liveness, Wakeup},
};
use sea_orm::{
    ColumnTrait as _, ConnectionTrait as _, DbBackend, EntityTrait, QueryFilter as _, Statement,
    TransactionTrait as _, sea_query::Expr,
};
use student_store::entity::{
    outbox::{self, FailureKind, OutboxStatus},
    students,
};
use student_store::outbox::{self as store, Problem};
use student_store::wake::WakeRelays;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::{
    on_both_backends,
    support::{
        Backend, TestApp,
        app::AppOptions,
        app::spawn_app_with,
        app::test_tuning,
        eventually, explained,
        invariants::{assert_each_student_linked_exactly_once, users_and_inbox_rows},
        pgbench, refusing_addr,
        scripted_users::{Script, scripted_users},
        spawn_app,
        stalling_proxy::StallingProxy,
        student_request,
    },
};

on_both_backends!(
    concurrent_claims_never_hand_out_one_row_twice,
    an_expired_lease_passes_to_another_relay_and_the_late_one_changes_nothing,
    a_late_finalize_changes_nothing_once_its_claim_is_gone,
    a_late_answer_under_an_old_key_changes_nothing_though_its_relay_holds_the_row_again,
    a_group_commit_records_each_row_as_it_would_alone,
    a_claim_takes_no_more_rows_than_free_call_slots,
    the_delivery_loop_refills_free_call_slots_together_and_never_overfills_them,
    rows_sent_many_to_a_call_each_take_a_slot,
    a_claim_leases_its_rows_for_the_whole_lease,
    a_full_claim_claims_again_at_once,
    after_a_claim_its_connection_commits_durably_again,
    a_claim_the_database_lost_leaves_its_row_due_and_its_finalize_changes_nothing,
    a_claim_after_a_quiet_spell_does_the_work_of_its_rows_not_of_the_backlog,
    a_failing_row_does_not_block_the_rows_behind_it,
    exhausted_attempts_fail_the_row_and_retry_failed_requeues_it_with_its_key,
    an_exhausted_row_takes_a_new_key_only_once_users_says_the_old_one_never_ran,
);

async fn create_students(app: &TestApp, range: std::ops::Range<usize>) {
    for n in range {
        app.student
            .clone()
            .create_student(student_request(n))
            .await
            .expect("created");
    }
}

/// Writes ten students, then runs the delivery loop, tuned by `tuning`, against a Users
/// that accepts connections and never answers (they complete in the kernel's backlog; nothing reads them), with nothing
/// to wake it but a 300 s poll. Its calls would wait out their minute: the test aborts the
/// task. The listener is returned to be kept for the test's length.
async fn ten_rows_to_a_silent_users(
    app: &TestApp,
    tuning: RunConfig,
) -> (tokio::task::JoinHandle<()>, tokio::net::TcpListener) {
    create_students(app, 0..10).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let relay = app.relay_with(
        &format!("http://{}", silent.local_addr().expect("addr")),
        RunConfig {
            poll_interval: Duration::from_secs(300),
            call_timeout: Duration::from_secs(60),
            lease: Duration::from_secs(120),
            ..tuning
        },
    );
    let running = tokio::spawn(async move {
        relay
            .run(Wakeup::poll_only(), CancellationToken::new())
            .await;
    });
    (running, silent)
}

async fn rows(app: &TestApp) -> Vec<outbox::Model> {
    let mut rows = outbox::Entity::find()
        .all(&app.student_db)
        .await
        .expect("outbox");
    rows.sort_by_key(|row| row.id);
    rows
}

/// Leaves the only student's row `failed` as `exhausted` after three refused attempts.
async fn exhaust_the_row(app: &TestApp) -> outbox::Model {
    let (_refusing, addr) = refusing_addr();
    let unreachable = app.relay_with(
        &format!("http://{addr}"),
        RunConfig {
            max_attempts: 3,
            backoff_max: Duration::from_millis(1),
            ..test_tuning()
        },
    );
    let failed = eventually(
        "three attempts used up",
        Duration::from_secs(20),
        || async {
            unreachable.deliver_batch().await.expect("batch");
            let row = rows(app).await.remove(0);
            (row.status == OutboxStatus::Failed).then_some(row)
        },
    )
    .await;
    assert_eq!(
        (failed.attempts, failed.failure_kind),
        (3, Some(FailureKind::Exhausted))
    );
    failed
}

async fn concurrent_claims_never_hand_out_one_row_twice(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..60).await;
    let claimers = (0..4).map(|n| {
        let db = app.student_db.clone();
        async move {
            let mut mine = Vec::new();
            loop {
                let batch =
                    store::claim_batch(&db, &format!("claimer-{n}"), 7, Duration::from_secs(60))
                        .await
                        .expect("claim");
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|row| (row.id, row.locked_by)));
            }
        }
    });
    let claimed: Vec<_> = futures::future::join_all(claimers)
        .await
        .into_iter()
        .flatten()
        .collect();
    let ids: HashSet<i64> = claimed.iter().map(|(id, _)| *id).collect();
    assert_eq!(claimed.len(), 60, "every row claimed once");
    assert_eq!(ids.len(), 60, "no row claimed twice");
    let stored = rows(&app).await;
    assert!(
        stored
            .iter()
            .all(|row| row.status == OutboxStatus::Processing && row.attempts == 1)
    );
    for (id, locked_by) in claimed {
        let row = stored.iter().find(|row| row.id == id).expect("row");
        assert_eq!(
            row.locked_by, locked_by,
            "the lease names the relay that claimed it"
        );
    }
}

async fn an_expired_lease_passes_to_another_relay_and_the_late_one_changes_nothing(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..1).await;
    let first = store::claim_batch(&app.student_db, "relay-a", 10, Duration::from_millis(100))
        .await
        .expect("claim");
    assert_eq!(first.len(), 1);
    assert!(
        store::claim_batch(&app.student_db, "relay-b", 10, Duration::from_secs(60))
            .await
            .expect("claim")
            .is_empty(),
        "leased"
    );
    let second = eventually("the lease to expire", Duration::from_secs(10), || async {
        let batch = store::claim_batch(&app.student_db, "relay-b", 10, Duration::from_secs(60))
            .await
            .expect("claim");
        (!batch.is_empty()).then_some(batch)
    })
    .await;
    assert_eq!(
        (
            second[0].id,
            second[0].attempts,
            second[0].locked_by.as_deref()
        ),
        (first[0].id, 2, Some("relay-b"))
    );
    // Relay A, late, records a transient failure and a rejection, and hands its claim back
    // (its lease too short to send in): none of it touches B's row, which is not `pending`
    // again while B's call is in flight.
    assert_eq!(
        late_writes(&app, &first[0], "relay-a").await,
        (false, false, 0),
        "reported as not applied"
    );
    let row = rows(&app).await.remove(0);
    assert_eq!(
        (row.status, row.locked_by.as_deref(), row.last_error),
        (OutboxStatus::Processing, Some("relay-b"), None)
    );

    // The same relay claiming a row again once its own lease ran out: what it learns late
    // about its first claim changes nothing either (the attempt tells the claims apart).
    create_students(&app, 1..2).await;
    let claim = || store::claim_batch(&app.student_db, "relay-c", 10, Duration::from_millis(100));
    let early = claim().await.expect("claim");
    assert_eq!(early.len(), 1);
    let again = eventually(
        "relay-c's lease to expire",
        Duration::from_secs(10),
        || async {
            let batch = claim().await.expect("claim");
            (!batch.is_empty()).then_some(batch)
        },
    )
    .await;
    assert_eq!((again[0].id, again[0].attempts), (early[0].id, 2));
    assert_eq!(
        late_writes(&app, &early[0], "relay-c").await,
        (false, false, 0),
        "reported as not applied"
    );
    let row = rows(&app).await.remove(1);
    assert_eq!(
        (row.status, row.attempts, row.last_error),
        (OutboxStatus::Processing, 2, None)
    );
}

/// What a relay whose claim of `row` is gone does when it learns its call's outcome late:
/// records a retry, records a rejection, and hands the row back. Each is fenced by the
/// claim; returns whether the retry and the rejection applied, and how many rows went back.
async fn late_writes(app: &TestApp, row: &outbox::Model, relay: &str) -> (bool, bool, u64) {
    let problem = Problem::new("LATE", "late");
    let retried = store::record_retry(&app.student_db, row, relay, &problem, Duration::ZERO)
        .await
        .expect("retry");
    let failed =
        store::record_failure(&app.student_db, row, relay, FailureKind::Rejected, &problem)
            .await
            .expect("fail");
    let released = store::release(&app.student_db, &[store::Claim::from(row)], relay)
        .await
        .expect("release");
    (retried, failed, released)
}

async fn a_failing_row_does_not_block_the_rows_behind_it(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // The oldest row will be rejected: its document number is taken in Users.
    app.users
        .clone()
        .create_user(crate::support::conflicting_user_request(0))
        .await
        .expect("other user");
    create_students(&app, 0..4).await;
    let outcome = app.relay().deliver_batch().await.expect("batch");
    assert_eq!(
        (outcome.claimed, outcome.delivered, outcome.failed),
        (4, 3, 1)
    );
    let statuses: Vec<_> = rows(&app).await.into_iter().map(|row| row.status).collect();
    assert_eq!(
        statuses,
        [
            OutboxStatus::Failed,
            OutboxStatus::Done,
            OutboxStatus::Done,
            OutboxStatus::Done
        ]
    );
}

async fn exhausted_attempts_fail_the_row_and_retry_failed_requeues_it_with_its_key(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..1).await;
    let failed = exhaust_the_row(&app).await;
    assert_eq!(
        failed.error_code.as_deref(),
        Some("UNAVAILABLE"),
        "the last attempt's reason: {:?}",
        failed.last_error
    );

    let mut out = Vec::new();
    let summary = retry_failed::retry_failed(
        &app.student_db,
        &app.relay().users,
        retry_failed::Selection::All,
        retry_failed::Keys::Keep,
        &mut out,
    )
    .await
    .expect("retry");
    assert_eq!(summary.exit_code(), 0);
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        format!(
            "id={} key={} requeued\nrequeued=1 linked=0 skipped=0 errors=0\n",
            failed.id, failed.idempotency_key
        )
    );
    let requeued = rows(&app).await.remove(0);
    assert_eq!(
        (
            requeued.status,
            requeued.attempts,
            requeued.idempotency_key.as_str()
        ),
        (OutboxStatus::Pending, 0, failed.idempotency_key.as_str())
    );

    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

async fn an_exhausted_row_takes_a_new_key_only_once_users_says_the_old_one_never_ran(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..1).await;
    let failed = exhaust_the_row(&app).await;

    // Users cannot be asked about the old key: the row keeps it, and stays failed.
    let (_refusing, addr) = refusing_addr();
    let unreachable = app.relay_to(&format!("http://{addr}"));
    let mut out = Vec::new();
    let summary = retry_failed::retry_failed(
        &app.student_db,
        &unreachable.users,
        retry_failed::Selection::Id(failed.id),
        retry_failed::Keys::New,
        &mut out,
    )
    .await
    .expect("retry");
    let printed = String::from_utf8(out).expect("utf-8");
    assert_eq!(summary.exit_code(), 2, "{printed}");
    assert!(
        printed.starts_with(&format!(
            "id={} key={} not re-keyed: cannot ask Users about the old key: UNAVAILABLE: ",
            failed.id, failed.idempotency_key
        )),
        "{printed}"
    );
    assert!(
        printed.ends_with("\nrequeued=0 linked=0 skipped=0 errors=1\n"),
        "{printed}"
    );
    assert_eq!(rows(&app).await.remove(0), failed, "unchanged");

    // Users says the old key never ran (NOT_IN_INBOX): a new key is safe.
    let mut out = Vec::new();
    let summary = retry_failed::retry_failed(
        &app.student_db,
        &app.relay().users,
        retry_failed::Selection::All,
        retry_failed::Keys::New,
        &mut out,
    )
    .await
    .expect("retry");
    assert_eq!(summary.exit_code(), 0);
    let rekeyed = rows(&app).await.remove(0);
    assert_ne!(rekeyed.idempotency_key, failed.idempotency_key);
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        format!(
            "id={} key={} requeued (new key; was {}): Users holds no user of student {}\n\
             requeued=1 linked=0 skipped=0 errors=0\n",
            failed.id, rekeyed.idempotency_key, failed.idempotency_key, failed.aggregate_id
        )
    );
    assert_eq!(
        users_and_inbox_rows(&app.users_db).await,
        (0, 0),
        "asking created nothing"
    );
    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;

    // The row is done now: `--id` naming it names no failed row, an error (exit 2) that
    // changes nothing.
    let done = rows(&app).await.remove(0);
    let mut out = Vec::new();
    let summary = retry_failed::retry_failed(
        &app.student_db,
        &app.relay().users,
        retry_failed::Selection::Id(failed.id),
        retry_failed::Keys::New,
        &mut out,
    )
    .await
    .expect("retry");
    assert_eq!(summary.exit_code(), 2);
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        format!(
            "no failed outbox row has id {}\nrequeued=0 linked=0 skipped=0 errors=1\n",
            failed.id
        )
    );
    assert_eq!(rows(&app).await.remove(0), done, "unchanged");
}

async fn a_late_finalize_changes_nothing_once_its_claim_is_gone(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..1).await;
    let db = &app.student_db;
    let user = uuid::Uuid::now_v7();
    let created = store::Delivered::UserCreated(user);
    let unlinked = |row: &outbox::Model| {
        let student_id = row.aggregate_id;
        async move {
            students::Entity::find_by_id(student_id)
                .one(db)
                .await
                .expect("student")
                .expect("exists")
                .user_id
                .is_none()
        }
    };

    // Lost to another relay: A's lease ran out and B claimed the row.
    let by_a = store::claim_batch(db, "relay-a", 1, Duration::from_millis(100))
        .await
        .expect("claim")
        .remove(0);
    let by_b = eventually("A's lease to run out", Duration::from_secs(10), || async {
        store::claim_batch(db, "relay-b", 1, Duration::from_secs(60))
            .await
            .expect("claim")
            .pop()
    })
    .await;
    assert_eq!(by_b.id, by_a.id);
    let late = store::record_delivery(db, &by_a, "relay-a", created).await;
    assert!(
        matches!(late, Err(store::RecordError::ClaimLost(id)) if id == by_a.id),
        "{late:?}"
    );
    assert_eq!(
        rows(&app).await[0],
        by_b,
        "B's claim and lease are untouched"
    );
    assert!(unlinked(&by_a).await);
    assert!(
        !store::record_retry(
            db,
            &by_a,
            "relay-a",
            &Problem::new("LATE", "late"),
            Duration::ZERO
        )
        .await
        .expect("retry")
    );
    assert!(
        !store::record_failure(
            db,
            &by_a,
            "relay-a",
            FailureKind::Rejected,
            &Problem::new("LATE", "late")
        )
        .await
        .expect("fail")
    );
    assert_eq!(rows(&app).await[0], by_b, "still untouched");

    // Failed meanwhile: a late finalize cannot turn a failed row done.
    create_students(&app, 1..2).await;
    let by_c = claim_and_exhaust(db, "relay-c").await;
    let failed = rows(&app).await.remove(1);
    let late = store::record_delivery(db, &by_c, "relay-c", created).await;
    assert!(
        matches!(late, Err(store::RecordError::ClaimLost(_))),
        "{late:?}"
    );
    assert_eq!(rows(&app).await[1], failed, "still failed");
    assert!(unlinked(&by_c).await);

    // Re-keyed meanwhile: the old key's user is never linked to the row's new operation.
    assert!(
        store::redrive(db, &failed, "a-fresh-key")
            .await
            .expect("redrive")
    );
    let rekeyed = rows(&app).await.remove(1);
    let late = store::record_delivery(db, &by_c, "relay-c", created).await;
    assert!(
        matches!(late, Err(store::RecordError::ClaimLost(_))),
        "{late:?}"
    );
    assert_eq!(rows(&app).await[1], rekeyed);
    assert_eq!(
        (rekeyed.status, rekeyed.idempotency_key.as_str()),
        (OutboxStatus::Pending, "a-fresh-key")
    );
    assert!(unlinked(&by_c).await);

    // The relay that does hold a row still records it.
    store::record_delivery(db, &by_b, "relay-b", created)
        .await
        .expect("B holds the row");
    let done = rows(&app).await.remove(0);
    assert_eq!(
        (done.status, done.result, done.locked_by),
        (OutboxStatus::Done, Some(user.to_string()), None)
    );
    assert!(!unlinked(&by_b).await);
}

/// Claims the oldest due row for `relay` and fails it `exhausted`, as a relay that ran out
/// of attempts does; returns the claim it failed.
pub(crate) async fn claim_and_exhaust(
    db: &sea_orm::DatabaseConnection,
    relay: &str,
) -> outbox::Model {
    let claim = store::claim_batch(db, relay, 1, Duration::from_secs(60))
        .await
        .expect("claim")
        .remove(0);
    let gave_up = Problem::new("UNAVAILABLE", "gave up");
    assert!(
        store::record_failure(db, &claim, relay, FailureKind::Exhausted, &gave_up)
            .await
            .expect("fail")
    );
    claim
}

/// The key is part of every fence: a row failed, re-keyed (`retry-failed --new-key`) and
/// claimed again by the same relay is held by the same relay at the same attempt as its
/// old claim (attempts start again at 0), so only the key tells the old claim's late answer
/// from the new one's. That answer, recorded alone or in a batch beside a row it does hold,
/// changes nothing: the row stays `processing` under its new key, its student unlinked.
async fn a_late_answer_under_an_old_key_changes_nothing_though_its_relay_holds_the_row_again(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..2).await;
    let db = &app.student_db;
    let lease = Duration::from_secs(60);
    let old = claim_and_exhaust(db, "relay-c").await;
    let failed = rows(&app).await.remove(0);
    assert!(
        store::redrive(db, &failed, "a-fresh-key")
            .await
            .expect("redrive")
    );
    let claimed = store::claim_batch(db, "relay-c", 2, lease)
        .await
        .expect("claim");
    let (again, other) = (&claimed[0], &claimed[1]);
    assert_eq!(again.id, old.id);
    assert_eq!(
        (again.locked_by.as_deref(), again.attempts),
        (old.locked_by.as_deref(), old.attempts),
        "only the key tells the claims apart"
    );
    let late = || store::Delivered::UserCreated(uuid::Uuid::now_v7());

    let alone = store::record_delivery(db, &old, "relay-c", late()).await;
    assert!(
        matches!(alone, Err(store::RecordError::ClaimLost(id)) if id == old.id),
        "{alone:?}"
    );
    let problem = Problem::new("LATE", "late");
    assert!(
        !store::record_failure(db, &old, "relay-c", FailureKind::Rejected, &problem)
            .await
            .expect("fail")
    );
    assert!(
        !store::record_retry(db, &old, "relay-c", &problem, Duration::ZERO)
            .await
            .expect("retry")
    );
    let batch = store::record_deliveries(
        db,
        "relay-c",
        &[(old.clone(), late()), (other.clone(), late())],
    )
    .await
    .expect("batch");
    assert!(
        matches!(batch.results[..], [Err(store::RecordError::ClaimLost(id)), Ok(())] if id == old.id),
        "{:?}",
        batch.results
    );
    let now = rows(&app).await;
    assert_eq!(&now[0], again, "held under its new key, untouched");
    assert_eq!(now[1].status, OutboxStatus::Done, "the row it does hold");
    let student = students::Entity::find_by_id(old.aggregate_id)
        .one(db)
        .await
        .expect("student")
        .expect("exists");
    assert_eq!(student.user_id, None);
}

/// The relay records answered rows many to a transaction (`record_deliveries`): each row
/// must come out as `record_delivery` alone would leave it, whichever rows beside it are
/// late, refused or repeats.
async fn a_group_commit_records_each_row_as_it_would_alone(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..7).await;
    let db = &app.student_db;
    let claimed = store::claim_batch(db, "relay-a", 7, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 7);
    let users: Vec<_> = (0..7).map(|_| uuid::Uuid::now_v7()).collect();
    let created = |n: usize| (claimed[n].clone(), store::Delivered::UserCreated(users[n]));
    let link = |n: usize, user: uuid::Uuid| {
        let student = claimed[n].aggregate_id;
        async move {
            students::Entity::update_many()
                .col_expr(
                    students::Column::UserId,
                    sea_orm::sea_query::Expr::value(user),
                )
                .filter(students::Column::Id.eq(student))
                .exec(db)
                .await
                .expect("linked by hand");
        }
    };
    // Row 1 was recorded already (this answer is a late repeat); row 2's student is
    // linked to another user; row 5's student already has its own user (a repeat).
    store::record_delivery(db, &claimed[1], "relay-a", created(1).1)
        .await
        .expect("recorded alone");
    let other = uuid::Uuid::now_v7();
    link(2, other).await;
    link(5, users[5]).await;
    // Rows 3 and 6's students already reflect a later change (version and synced_version
    // 2): recording their creation must not lower it, alone or in a set.
    for n in [3, 6] {
        students::Entity::update_many()
            .col_expr(
                students::Column::Version,
                sea_orm::sea_query::Expr::value(2),
            )
            .col_expr(
                students::Column::SyncedVersion,
                sea_orm::sea_query::Expr::value(2),
            )
            .filter(students::Column::Id.eq(claimed[n].aggregate_id))
            .exec(db)
            .await
            .expect("synced later by hand");
    }
    // Every row still held carries the error of an earlier attempt, which `done` clears.
    outbox::Entity::update_many()
        .col_expr(
            outbox::Column::LastError,
            sea_orm::sea_query::Expr::value("an earlier attempt failed"),
        )
        .col_expr(
            outbox::Column::ErrorCode,
            sea_orm::sea_query::Expr::value("UNAVAILABLE"),
        )
        .filter(outbox::Column::Status.eq(OutboxStatus::Processing))
        .exec(db)
        .await
        .expect("earlier errors");

    // A batch with a refused row, then one without.
    let first = store::record_deliveries(
        db,
        "relay-a",
        &[created(0), created(1), created(2), created(3)],
    )
    .await
    .expect("first batch");
    let second = store::record_deliveries(
        db,
        "relay-a",
        &[created(4), created(1), created(5), created(6)],
    )
    .await
    .expect("second batch");
    // The refused link sends the first batch row by row; the second is set-based.
    assert_eq!(
        (first.path, second.path),
        (store::BatchPath::RowByRow, store::BatchPath::Set)
    );
    let outcome = |recorded: store::Recorded| -> Vec<String> {
        recorded
            .results
            .into_iter()
            .map(|result| match result {
                Ok(()) => "recorded".to_owned(),
                Err(store::RecordError::ClaimLost(id)) => format!("claim lost {id}"),
                Err(store::RecordError::LinkConflict { linked, .. }) if linked == other => {
                    "linked to the other user".to_owned()
                }
                Err(err) => format!("{err}"),
            })
            .collect()
    };
    let lost = format!("claim lost {}", claimed[1].id);
    assert_eq!(
        outcome(first),
        ["recorded", &lost, "linked to the other user", "recorded"]
    );
    assert_eq!(outcome(second), ["recorded", &lost, "recorded", "recorded"]);

    // What is stored: every row but the refused one done with its user, lease cleared; each
    // student linked to its own user (row 2's to the other) with synced_version 1 where
    // done, never lowered (rows 3 and 6: 2).
    let rows = rows(&app).await;
    for (n, row) in rows.iter().enumerate() {
        let student = students::Entity::find_by_id(row.aggregate_id)
            .one(db)
            .await
            .expect("student")
            .expect("exists");
        if n == 2 {
            assert_eq!(
                (row.status, row.locked_by.as_deref(), row.result.as_ref()),
                (OutboxStatus::Processing, Some("relay-a"), None),
                "the refused row is still held"
            );
            assert_eq!((student.user_id, student.synced_version), (Some(other), 0));
        } else {
            assert_eq!(
                (row.status, row.locked_by.as_deref(), row.result.clone()),
                (OutboxStatus::Done, None, Some(users[n].to_string())),
                "row {n}"
            );
            assert_eq!(
                (
                    row.locked_until,
                    row.last_error.as_deref(),
                    row.error_code.as_deref()
                ),
                (None, None, None),
                "row {n} keeps nothing of its lease or an earlier error"
            );
            let synced = if n == 3 || n == 6 { 2 } else { 1 };
            assert_eq!(
                (student.user_id, student.synced_version),
                (Some(users[n]), synced),
                "student of row {n}"
            );
        }
    }
}

async fn a_claim_takes_no_more_rows_than_free_call_slots(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..10).await;
    let relay = app.relay_with(
        &app.users_url(),
        RunConfig {
            batch_size: 64,
            concurrency: 3,
            ..test_tuning()
        },
    );
    assert_eq!(relay.claim_size(), 3);
    let outcome = relay.deliver_batch().await.expect("batch");
    assert_eq!((outcome.claimed, outcome.delivered), (3, 3));
    let statuses: Vec<_> = rows(&app).await.into_iter().map(|row| row.status).collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == OutboxStatus::Pending)
            .count(),
        7,
        "the other rows were never leased: {statuses:?}"
    );
}

/// How many of `rows` are done, leased, and never leased, each row claimed once at most
/// (the slot tests answer every call they let through, and fail none).
fn done_leased_waiting(rows: &[outbox::Model]) -> (usize, usize, usize) {
    let count = |state| {
        rows.iter()
            .filter(|row| (row.status, row.attempts) == state)
            .count()
    };
    (
        count((OutboxStatus::Done, 1)),
        count((OutboxStatus::Processing, 1)),
        count((OutboxStatus::Pending, 0)),
    )
}

/// A relay running on a task of its own with eight slots (rows in flight) and
/// `rows_per_call`, woken by nothing but a 300 s poll, its calls and leases long enough
/// for any test; sending to `users_url`.
fn eight_slots_polling_only(
    app: &TestApp,
    users_url: &str,
    rows_per_call: u16,
) -> tokio::task::JoinHandle<()> {
    let relay = app.relay_with(
        users_url,
        RunConfig {
            batch_size: 64,
            concurrency: 8,
            rows_per_call,
            poll_interval: Duration::from_secs(300),
            call_timeout: Duration::from_secs(60),
            lease: Duration::from_secs(120),
            ..test_tuning()
        },
    );
    tokio::spawn(async move {
        relay
            .run(Wakeup::poll_only(), CancellationToken::new())
            .await;
    })
}

/// The delivery loop keeps to the same bound as calls finish, and refills its free call
/// slots together: with eight slots it claims again once two are free (a claim is a
/// transaction; one per finished call would cost more than it gains). Twenty rows wait,
/// one call per row, nothing wakes the relay but a 300 s poll, and Users answers only the
/// calls the test lets through: eight rows are claimed, then two calls are answered, and
/// the next two rows are claimed in one claim, never one at a time and never more.
async fn the_delivery_loop_refills_free_call_slots_together_and_never_overfills_them(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..20).await;
    let gate = Arc::new(Semaphore::new(0));
    let users = scripted_users(
        &app,
        Script {
            create_user_gate: Some(gate.clone()),
            ..Script::default()
        },
    )
    .await;
    let running = eight_slots_polling_only(&app, &users.url, 1);
    // A claim is one statement, so the first row seen leased shows the whole claim.
    let first = eventually("the first claim", Duration::from_secs(20), || async {
        let rows = rows(&app).await;
        rows.iter()
            .any(|row| row.status == OutboxStatus::Processing)
            .then_some(rows)
    })
    .await;
    assert_eq!(
        done_leased_waiting(&first),
        (0, 8, 12),
        "one row per call slot"
    );

    gate.add_permits(2);
    let refilled = eventually(
        "two calls answered and their slots refilled",
        Duration::from_secs(20),
        || async {
            let rows = rows(&app).await;
            let (done, leased, _) = done_leased_waiting(&rows);
            (done == 2 && done + leased >= 10).then_some(rows)
        },
    )
    .await;
    assert_eq!(
        done_leased_waiting(&refilled),
        (2, 8, 10),
        "two slots freed, two rows claimed"
    );
    let second_claim: HashSet<_> = refilled[8..10].iter().map(|row| row.locked_until).collect();
    assert_eq!(
        second_claim.len(),
        1,
        "the two rows after the first eight leased in one claim: {second_claim:?}"
    );
    // The other calls would wait for permits: the relay is stopped without them.
    running.abort();
}

/// README: "`--concurrency` counts rows in flight", not calls: with CreateUsers calls of
/// four rows, eight slots hold two calls. Twenty rows wait, nothing wakes the relay but a
/// 300 s poll, and Users answers only the calls the test lets through: eight rows are
/// claimed; one call answered frees four slots, and four more rows are claimed, never the
/// rest. (Counting calls, the relay would claim all twenty at once.)
async fn rows_sent_many_to_a_call_each_take_a_slot(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..20).await;
    let gate = Arc::new(Semaphore::new(0));
    let users = scripted_users(
        &app,
        Script {
            create_users_gate: Some(gate.clone()),
            ..Script::default()
        },
    )
    .await;
    let running = eight_slots_polling_only(&app, &users.url, 4);
    eventually(
        "both calls of the first claim",
        Duration::from_secs(20),
        || async { (users.create_users_calls.load(Ordering::SeqCst) >= 2).then_some(()) },
    )
    .await;
    gate.add_permits(1);
    let refilled = eventually(
        "one call answered and its four slots refilled",
        Duration::from_secs(20),
        || async {
            let rows = rows(&app).await;
            let (done, leased, _) = done_leased_waiting(&rows);
            (done == 4 && done + leased >= 12).then_some(rows)
        },
    )
    .await;
    assert_eq!(
        done_leased_waiting(&refilled),
        (4, 8, 8),
        "eight rows in flight, never more"
    );
    running.abort();
}

/// The database records the lease the relay counts on, whole: the relay never starts a
/// call that could outlive its own count of the lease, which must then never outlive the
/// database's (README: "never ends later than the one the database records").
async fn a_claim_leases_its_rows_for_the_whole_lease(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..1).await;
    let lease = Duration::from_secs(60);
    let before = crate::relay_delivery::clock_of_the_rows(&app).await;
    let claimed = store::claim_batch(&app.student_db, "lease-check", 1, lease)
        .await
        .expect("claim");
    let after = crate::relay_delivery::clock_of_the_rows(&app).await;
    let until = claimed[0].locked_until.expect("leased");
    let lease = chrono::TimeDelta::from_std(lease).expect("a lease");
    assert!(
        before + lease <= until && until <= after + lease,
        "leased until {until}, claimed between {before} and {after}"
    );
}

/// A claim commits without waiting for the disk on PostgreSQL, and for its own transaction
/// only: the connection that ran it goes back to the pool and may carry a finalize next,
/// which must reach the disk before it is acknowledged. (SQLite claims as it commits
/// everything, durably.)
async fn after_a_claim_its_connection_commits_durably_again(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..3).await;
    // One connection, so the setting read below is the claiming connection's.
    let db = platform::db::connect_with(&app.databases.student_url, 1)
        .await
        .expect("one connection");
    let claimed = store::claim_batch(&db, "durability-check", 10, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    let (query, durable) = match db.get_database_backend() {
        DbBackend::Postgres => ("SHOW synchronous_commit", "on"),
        // 2 = FULL: the log is synced at every commit.
        _ => ("PRAGMA synchronous", "2"),
    };
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), query))
        .await
        .expect("setting")
        .expect("a row");
    let setting = row
        .try_get_by_index::<String>(0)
        .or_else(|_| row.try_get_by_index::<i64>(0).map(|n| n.to_string()))
        .expect("value");
    assert_eq!(setting, durable, "{query} after a claim");
    db.close().await.expect("close");
}

/// A claim that never reached the disk (PostgreSQL crashed right after acknowledging it)
/// leaves the row as it was before the claim. The relay that made it may already have sent
/// the row and may try to record Users' answer: that finalize changes nothing, and the row
/// is delivered again under its key and linked once.
async fn a_claim_the_database_lost_leaves_its_row_due_and_its_finalize_changes_nothing(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    create_students(&app, 0..1).await;
    let db = &app.student_db;
    let before = rows(&app).await.remove(0);
    let lost = store::claim_batch(db, "relay-a", 1, Duration::from_secs(60))
        .await
        .expect("claim")
        .remove(0);
    // The crash: the row is back to what the disk held before the claim.
    outbox::Entity::update_many()
        .col_expr(outbox::Column::Status, Expr::value(before.status))
        .col_expr(
            outbox::Column::LockedBy,
            Expr::value(before.locked_by.clone()),
        )
        .col_expr(
            outbox::Column::LockedUntil,
            Expr::value(before.locked_until),
        )
        .col_expr(outbox::Column::Attempts, Expr::value(before.attempts))
        .filter(outbox::Column::Id.eq(lost.id))
        .exec(db)
        .await
        .expect("the claim undone");
    assert_eq!(rows(&app).await[0], before);

    let late = store::record_delivery(
        db,
        &lost,
        "relay-a",
        store::Delivered::UserCreated(uuid::Uuid::now_v7()),
    )
    .await;
    assert!(
        matches!(late, Err(store::RecordError::ClaimLost(id)) if id == lost.id),
        "{late:?}"
    );
    assert_eq!(rows(&app).await[0], before, "the finalize changed nothing");

    assert_eq!(
        app.relay().deliver_batch().await.expect("batch").delivered,
        1
    );
    let done = rows(&app).await.remove(0);
    assert_eq!(done.status, OutboxStatus::Done);
    assert_eq!(done.idempotency_key, before.idempotency_key);
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 1).await;
}

/// Writes `count` create-user rows with `status`, due long ago, for students of their own, in
/// one statement.
async fn write_rows(db: &sea_orm::DatabaseConnection, count: usize, status: &str) {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => format!(
            "INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
               idempotency_key, status, attempts, available_at, created_at) \
             SELECT gen_random_uuid(), 1, 'create-user', '{{}}', gen_random_uuid()::text, \
               '{status}', 0, now(), now() FROM generate_series(1, {count})"
        ),
        _ => format!(
            "INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
               idempotency_key, status, attempts, available_at, created_at) \
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count}) \
             SELECT randomblob(16), 1, 'create-user', '{{}}', lower(hex(randomblob(16))), \
               '{status}', 0, '2000-01-01T00:00:00.000000+00:00', \
               '2000-01-01T00:00:00.000000+00:00' FROM n"
        ),
    };
    db.execute_unprepared(&sql).await.expect("rows written");
}

/// After an outage of Users: statistics gathered while the outbox was quiet (every row
/// `done`), then a backlog of 20,000 rows. A claim of 64 still does the work of 64 rows:
/// one probe of `outbox_unfinished_by_student` per candidate, not a walk of the backlog per
/// candidate (which PostgreSQL planned for the claim's former `NOT EXISTS`).
/// Work is counted in pages read (PostgreSQL) or read off the plan (SQLite), never timed.
async fn a_claim_after_a_quiet_spell_does_the_work_of_its_rows_not_of_the_backlog(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let db = &app.student_db;
    write_rows(db, 20_000, "done").await;
    db.execute_unprepared("ANALYZE").await.expect("statistics");
    write_rows(db, 20_000, "pending").await;

    let claim = store::claim_statement(
        db.get_database_backend(),
        "relay-a",
        64,
        Duration::from_secs(60),
    );
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let explain = explained("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)", claim);
            let transaction = db.begin().await.expect("begin");
            let plan: serde_json::Value = transaction
                .query_one_raw(explain)
                .await
                .expect("explain")
                .expect("a plan")
                .try_get_by_index(0)
                .expect("json");
            transaction.rollback().await.expect("rollback");
            let top = &plan[0]["Plan"];
            let pages = top["Shared Hit Blocks"].as_i64().expect("hits")
                + top["Shared Read Blocks"].as_i64().expect("reads");
            assert_eq!(top["Actual Rows"], 64, "{plan:#}");
            // About 1,700 (each claimed row updates eight indexes); the `NOT EXISTS` form
            // read 1.3 million.
            assert!(pages < 10_000, "a claim of 64 read {pages} pages: {plan:#}");
        }
        _ => {
            let explain = explained("EXPLAIN QUERY PLAN", claim);
            let details: Vec<String> = db
                .query_all_raw(explain)
                .await
                .expect("explain")
                .iter()
                .map(|row| row.try_get::<String>("", "detail").expect("detail"))
                .collect();
            // SQLite planned both forms this way; this holds it to the index.
            assert!(
                details
                    .iter()
                    .any(|step| step.contains("outbox_unfinished_by_student (aggregate_id=?")),
                "{details:#?}"
            );
        }
    }
    let claimed = store::claim_batch(db, "relay-a", 64, Duration::from_secs(60))
        .await
        .expect("claim");
    let oldest_pending: Vec<i64> = rows(&app)
        .await
        .into_iter()
        .filter(|row| row.status != OutboxStatus::Done)
        .take(64)
        .map(|row| row.id)
        .collect();
    assert_eq!(
        claimed.iter().map(|row| row.id).collect::<Vec<_>>(),
        oldest_pending
    );
}

/// `bench/pgbench/link.sql`, the drain's database-only ceiling, spells out the relay's claim
/// of 32 rows; it must stay the statement the relay runs (from its first CTE to the row
/// lock), or the ceiling measures something else.
#[test]
fn the_pgbench_link_script_claims_with_the_relays_own_statement() {
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let claim = |text: &str| {
        let (start, end) = ("no_flush AS MATERIALIZED", "SKIP LOCKED)");
        let from = text.find(start).expect("the claim's first CTE");
        let to = text[from..].find(end).expect("the row lock") + from + end.len();
        words(&text[from..to])
    };
    let relays = store::claim_statement(DbBackend::Postgres, "r", 32, Duration::ZERO);
    assert_eq!(claim(&pgbench::script("link.sql")), claim(&relays.sql));
}

/// PostgreSQL records a batch of answers in one statement, which locks the rows it finds
/// held by the relay's claims before it judges them (`FOR UPDATE OF outbox`): a claim by
/// another relay that commits while the statement waits for a row is seen, and that row's
/// answer is refused (`ClaimLost`), the other relay's claim untouched. (Judged on the
/// statement's snapshot instead, the row would be marked `done` over the other claim.)
/// The other claim is written by hand in a transaction held open until the batch waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_sees_a_claim_that_commits_while_it_waits_for_the_row() {
    use sea_orm::TransactionTrait as _;

    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    create_students(&app, 0..2).await;
    let db = app.student_db.clone();
    let claimed = store::claim_batch(&db, "relay-a", 2, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let taken = claimed[1].id;
    let other = db.begin().await.expect("a second connection");
    other
        .execute_unprepared(&format!(
            "UPDATE outbox SET locked_by = 'relay-b', attempts = attempts + 1 WHERE id = {taken}"
        ))
        .await
        .expect("claimed by relay-b, not yet committed");
    let deliveries: Vec<_> = claimed
        .iter()
        .map(|row| {
            (
                row.clone(),
                store::Delivered::UserCreated(uuid::Uuid::now_v7()),
            )
        })
        .collect();
    let batch = tokio::spawn({
        let db = db.clone();
        async move { store::record_deliveries(&db, "relay-a", &deliveries).await }
    });
    eventually(
        "the batch to wait for the row",
        Duration::from_secs(10),
        || async {
            let waiting = db
                .query_one_raw(sea_orm::Statement::from_string(
                    sea_orm::DbBackend::Postgres,
                    "SELECT count(*) AS waiting FROM pg_stat_activity \
                  WHERE datname = current_database() AND wait_event_type = 'Lock' \
                    AND query LIKE '%WITH answered%'",
                ))
                .await
                .expect("read")
                .and_then(|row| row.try_get::<i64>("", "waiting").ok())
                .unwrap_or(0);
            (waiting > 0).then_some(())
        },
    )
    .await;
    other.commit().await.expect("relay-b's claim committed");
    let recorded = batch.await.expect("joined").expect("batch");
    assert!(
        matches!(recorded.results[..], [Ok(()), Err(store::RecordError::ClaimLost(id))] if id == taken),
        "{:?}",
        recorded.results
    );
    let now = rows(&app).await;
    assert_eq!(now[0].status, OutboxStatus::Done);
    assert_eq!(
        (now[1].status, now[1].locked_by.as_deref(), now[1].attempts),
        (
            OutboxStatus::Processing,
            Some("relay-b"),
            claimed[1].attempts + 1
        ),
        "relay-b's claim untouched"
    );
}

/// PostgreSQL only: a brand-new outbox, never analyzed, behind a backlog. The relay's own
/// connections (`relay::open_when_ready`, set up by `outbox::CLAIMING_SESSION`) claim by
/// walking `outbox_claimable` in id order. A connection without that setting planned a
/// bitmap scan and a sort of every due row there (BENCHMARKS-JOURNAL.md, "A brand-new outbox").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_new_outbox_the_relays_claim_walks_the_index_in_id_order() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let db = &app.student_db;
    // Statistics must not arrive under the test: autovacuum would analyze the table.
    db.execute_unprepared("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        .await
        .expect("no autovacuum");
    write_rows(db, 20_000, "pending").await;
    let reltuples: f32 = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT reltuples FROM pg_class WHERE relname = 'outbox'",
        ))
        .await
        .expect("pg_class")
        .expect("a row")
        .try_get_by_index(0)
        .expect("reltuples");
    assert_eq!(reltuples, -1.0, "the outbox has never been analyzed");

    let relay_db = relay::open_when_ready(&app.databases.student_url, 1, &CancellationToken::new())
        .await
        .expect("the relay's connection");
    let claim = store::claim_statement(DbBackend::Postgres, "relay-a", 32, Duration::from_secs(60));
    let plan: Vec<String> = relay_db
        .query_all_raw(explained("EXPLAIN (COSTS OFF)", claim))
        .await
        .expect("explain")
        .iter()
        .map(|row| row.try_get_by_index::<String>(0).expect("a plan line"))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Scan using outbox_claimable on outbox candidate"),
        "{plan}"
    );
    assert!(!plan.contains("Bitmap"), "{plan}");
}

/// PostgreSQL only: the group commit in `bench/pgbench/link.sql` (after its claim) is the
/// relay's: the same one statement, rows locked and fenced, students checked, both
/// updated, once values are set aside (the script picks its rows with a sub-select where
/// the relay binds a `VALUES` list).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pgbench_link_script_records_as_the_relays_group_commit_does() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    create_students(&app, 0..2).await;
    let claimed = store::claim_batch(&app.student_db, "bench", 2, Duration::from_secs(60))
        .await
        .expect("claim");
    let deliveries: Vec<_> = claimed
        .into_iter()
        .map(|row| (row, store::Delivered::UserCreated(uuid::Uuid::now_v7())))
        .collect();
    let relays: Vec<String> = store::record_statements(DbBackend::Postgres, "bench", &deliveries)
        .iter()
        .map(|statement| pgbench::shapes(&statement.sql).remove(0))
        .collect();
    // After the claim (which ends in pgbench's `\gset`, not a `;`).
    let script = pgbench::script("link.sql");
    let after_claim = &script[script.find("WITH answered").expect("the group commit")..];
    let script = pgbench::shapes(after_claim);
    // The CTE's columns and everything from the row locks on.
    let what = |shape: &String| {
        let columns = &shape[..shape.find(" AS (").expect("a CTE")];
        let rest = &shape[shape.find("held AS MATERIALIZED").expect("the row locks")..];
        format!("{columns} … {rest}")
    };
    assert_eq!(relays.len(), 1, "one statement");
    assert_eq!(
        script.iter().map(what).collect::<Vec<_>>(),
        relays.iter().map(what).collect::<Vec<_>>()
    );
}

/// A relay that polls every 300 s delivers each new row within seconds, a new student's
/// and a change's: on PostgreSQL woken by the NOTIFY student-svc sends, after the commit
/// (the default) or inside the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_after_commit_wakes_an_idle_postgres_relay_long_before_its_poll() {
    a_commit_wakes_an_idle_relay(Backend::Postgres, WakeRelays::AfterCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_in_transaction_wakes_an_idle_postgres_relay_long_before_its_poll() {
    a_commit_wakes_an_idle_relay(Backend::Postgres, WakeRelays::InTransaction).await;
}

/// On SQLite, which has no NOTIFY, woken by its watch on the file's `data_version`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_wakes_an_idle_sqlite_relay_long_before_its_poll() {
    a_commit_wakes_an_idle_relay(Backend::Sqlite, WakeRelays::default()).await;
}

/// SQLite: the watcher wakes the relay for a commit that leaves a row pending, and not for
/// one that leaves none (as the relay's own finalizes do): a claim takes SQLite's one write
/// lock, so a relay woken for nothing takes it from CreateStudent's commits
/// (BENCHMARKS-JOURNAL.md, "SQLite relays woken by commits").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sqlite_watcher_wakes_the_relay_only_for_a_pending_row() {
    let Some(app) = spawn_app_with(Backend::Sqlite, AppOptions::default()).await else {
        return;
    };
    let wakeup = Wakeup::for_database(&app.databases.student_url).await;
    assert!(wakeup.is_listening(), "the watcher runs");
    // Two commits that leave nothing pending, each watched for 30 of the watcher's reads.
    for probe in 0..2 {
        app.student_db
            .execute_unprepared(&format!("CREATE TABLE probe_{probe} (x INTEGER)"))
            .await
            .expect("a commit with no outbox row");
        let woken =
            tokio::time::timeout(relay::wakeup::SQLITE_WATCH_INTERVAL * 30, wakeup.notified())
                .await;
        assert!(
            woken.is_err(),
            "woken by commit {probe}, with nothing pending"
        );
    }
    // A student's commit leaves its row pending (no relay runs): that one wakes it.
    commit_and_expect_a_wake_up(&app, &wakeup, 0..1, "by the commit that left a row pending").await;
    // Once: the row still pending, with no commit since, is no reason to wake it again.
    let woken =
        tokio::time::timeout(relay::wakeup::SQLITE_WATCH_INTERVAL * 30, wakeup.notified()).await;
    assert!(woken.is_err(), "woken again with no new commit");
}

/// The backends of `app`'s Student DB that LISTEN for new rows.
async fn listening_backends(app: &TestApp) -> Vec<i32> {
    let rows = app
        .student_db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT pid FROM pg_stat_activity \
                 WHERE datname = current_database() AND query LIKE 'LISTEN \"{}\"%'",
                student_store::OUTBOX_CHANNEL
            ),
        ))
        .await
        .expect("read pg_stat_activity");
    rows.iter()
        .map(|row| row.try_get::<i32>("", "pid").expect("pid"))
        .collect()
}

/// Liveness checks after half a second of quiet, each to be heard within 3 s.
const TEST_LIVENESS: Liveness = Liveness {
    quiet: Duration::from_millis(500),
    answer_within: Duration::from_secs(3),
};

/// Waits until `proxy` has accepted `count` connections. Each liveness check is one, made
/// only once the check before it was heard and the listener was quiet again.
async fn connections_accepted(proxy: &StallingProxy, count: u64) {
    eventually(
        &format!("{count} connections through the proxy"),
        Duration::from_secs(20),
        || async { (proxy.accepted() >= count).then_some(()) },
    )
    .await;
}

/// A relay's wake-ups listening through a proxy of the test's own on `app`'s Student DB,
/// with [`TEST_LIVENESS`].
async fn listening_through_a_proxy(app: &TestApp) -> (StallingProxy, Wakeup) {
    let proxy = StallingProxy::start(&app.databases.student_url).await;
    let wakeup = Wakeup::for_database_with(proxy.url(), TEST_LIVENESS).await;
    assert!(wakeup.is_listening(), "LISTENing");
    (proxy, wakeup)
}

/// Creates the students `range` and waits, 20 s at most, for the wake-up their commits
/// send; `why` names the wake-up the test expects.
async fn commit_and_expect_a_wake_up(
    app: &TestApp,
    wakeup: &Wakeup,
    range: std::ops::Range<usize>,
    why: &str,
) {
    create_students(app, range).await;
    tokio::time::timeout(Duration::from_secs(20), wakeup.notified())
        .await
        .unwrap_or_else(|_| panic!("not woken: {why}"));
}

/// PostgreSQL only (LISTEN): a listening connection that is lost and restored at once (its
/// backend ended, as a connection reaper or a failover does) wakes the relay with no commit
/// at all: rows committed while it was gone notified nobody, so the relay claims once.
/// The wake-up comes once a new connection LISTENs, and the relay never polls only
/// meanwhile (no loss counted); after it, commits wake the relay again, and the new
/// connection hears its liveness checks (sqlx LISTENs again to the probe channel too).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_listen_connection_restored_at_once_wakes_the_relay() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let (proxy, wakeup) = listening_through_a_proxy(&app).await;
    let before = listening_backends(&app).await;
    assert_eq!(before.len(), 1, "one listening connection");
    let ended = app
        .student_db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT pg_terminate_backend({}) AS ended", before[0]),
        ))
        .await
        .expect("end the listener's backend")
        .expect("a row")
        .try_get::<bool>("", "ended")
        .expect("a boolean");
    assert!(ended, "the listener's backend ended");

    tokio::time::timeout(Duration::from_secs(20), wakeup.notified())
        .await
        .expect("woken once the listener was back, with nothing committed");
    let after = listening_backends(&app).await;
    assert!(
        after.len() == 1 && after != before,
        "woken with a new connection listening, not before: {before:?} then {after:?}"
    );
    assert!(wakeup.is_listening(), "LISTENing again");
    assert_eq!(wakeup.losses(), 0, "repaired before it was reported");
    commit_and_expect_a_wake_up(&app, &wakeup, 0..1, "a commit wakes the relay again").await;
    // Two checks heard on the new connection: a third was sent.
    connections_accepted(&proxy, proxy.accepted() + 3).await;
    assert_eq!(wakeup.losses(), 0, "its checks heard");
    assert_eq!(listening_backends(&app).await, after, "the same listener");
}

/// PostgreSQL only: a listening connection gone without a word (open at both ends, nothing
/// getting through, as after a NAT or firewall dropped it) is found out by its liveness
/// check, replaced, and the relay woken for the row committed meanwhile, whose
/// notification never arrived; the lost connection's server side, still LISTENing, is
/// ended. Until then the checks are heard and the listener kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listen_connection_gone_silent_is_found_out_and_replaced() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let (proxy, wakeup) = listening_through_a_proxy(&app).await;
    let before = listening_backends(&app).await;
    assert_eq!(before.len(), 1, "one listening connection");
    // The listener's connection, then four checks: three heard.
    connections_accepted(&proxy, 5).await;
    assert_eq!(wakeup.losses(), 0, "a listener that hears its checks kept");
    assert_eq!(listening_backends(&app).await, before, "the same listener");

    proxy.silence_open_connections();
    commit_and_expect_a_wake_up(&app, &wakeup, 0..1, "once a new listener was up").await;
    assert_eq!(wakeup.losses(), 1, "the silent listener taken as lost");
    assert!(wakeup.is_listening(), "LISTENing again");
    let after = eventually(
        "the silent listener's server side ended, a new one listening",
        Duration::from_secs(20),
        || async {
            let after = listening_backends(&app).await;
            (after.len() == 1 && after != before).then_some(after)
        },
    )
    .await;
    commit_and_expect_a_wake_up(&app, &wakeup, 1..2, "a commit wakes the relay again").await;
    assert_eq!(
        listening_backends(&app).await,
        after,
        "the new listener kept"
    );
}

/// PostgreSQL only: a liveness check that cannot be sent (the server, here the proxy,
/// closing new connections) says nothing about the listener, which is kept and still
/// wakes the relay for a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_liveness_check_that_cannot_be_sent_keeps_the_listener() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let (proxy, wakeup) = listening_through_a_proxy(&app).await;
    proxy.refuse_new_connections(true);
    eventually("three unsent checks", Duration::from_secs(20), || async {
        (proxy.refused() >= 3).then_some(())
    })
    .await;
    assert_eq!(wakeup.losses(), 0, "the listener kept");
    assert!(wakeup.is_listening(), "LISTENing");
    commit_and_expect_a_wake_up(&app, &wakeup, 0..1, "a commit still wakes the relay").await;
}

async fn a_commit_wakes_an_idle_relay(backend: Backend, wake_relays: WakeRelays) {
    let options = AppOptions {
        wake_relays,
        ..AppOptions::default()
    };
    let Some(app) = spawn_app_with(backend, options).await else {
        return;
    };
    let relay = app.relay_with(
        &app.users_url(),
        RunConfig {
            poll_interval: Duration::from_secs(300),
            ..test_tuning()
        },
    );
    let wakeup = Wakeup::for_database(&app.databases.student_url).await;
    assert!(wakeup.is_listening(), "commits wake the relay");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { relay.run(wakeup, shutdown).await }
    });
    let all_done = || async {
        let rows = rows(&app).await;
        rows.iter()
            .all(|row| row.status == OutboxStatus::Done)
            .then_some(rows.len())
    };
    // Once a first row is delivered the relay is idle: it sleeps up to 300 s unless notified.
    for n in 0..2 {
        create_students(&app, n..n + 1).await;
        eventually(
            "the relay to deliver the new row",
            Duration::from_secs(20),
            all_done,
        )
        .await;
    }
    // A change's commit wakes it too (its update-user row).
    let first = rows(&app).await[0].aggregate_id;
    app.rename_student(&first.to_string()).await;
    let delivered = eventually(
        "the relay to deliver the change",
        Duration::from_secs(20),
        all_done,
    )
    .await;
    assert_eq!(delivered, 3, "two create-user rows and one update-user row");
    // An idle relay hears its stop at once, not at its next poll (300 s away).
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the idle relay stops when told, not at its next poll")
        .expect("relay task");
    assert_each_student_linked_exactly_once(&app.student_db, &app.users_db, 2).await;
}

/// README: the loop "claims again at once after a full claim", not after a call finishes
/// or a poll. Ten rows wait, a claim takes four at most, nothing wakes the relay but a
/// 300 s poll, and Users accepts connections but never answers: all ten are claimed (once
/// each) while not one call has finished.
async fn a_full_claim_claims_again_at_once(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let (running, _users) = ten_rows_to_a_silent_users(
        &app,
        RunConfig {
            batch_size: 4,
            ..test_tuning()
        },
    )
    .await;
    eventually(
        "all ten rows claimed before any call finished",
        Duration::from_secs(20),
        || async {
            rows(&app)
                .await
                .iter()
                .all(|row| row.status == OutboxStatus::Processing && row.attempts == 1)
                .then_some(())
        },
    )
    .await;
    // Its calls would wait out their minute: the relay is stopped without them.
    running.abort();
}

/// PostgreSQL only: its cached query plans are what is at stake. A plan cached while the
/// outbox was empty once made a claim of 16 re-run its candidate sub-select for every row
/// and lock all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_takes_at_most_its_limit_whatever_plan_was_cached() {
    use sea_orm::ConnectionTrait as _;
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    // One connection, so every claim below runs the same prepared statement.
    let db = platform::db::connect_with(&app.databases.student_url, 1)
        .await
        .expect("connect");
    db.execute_unprepared("ANALYZE outbox")
        .await
        .expect("analyze");
    for _ in 0..6 {
        let none = store::claim_batch(&db, "warm-up", 16, Duration::from_secs(60))
            .await
            .expect("claim");
        assert!(none.is_empty());
    }
    create_students(&app, 0..200).await;
    let claimed = store::claim_batch(&db, "relay", 16, Duration::from_secs(60))
        .await
        .expect("claim");
    let processing = rows(&app)
        .await
        .into_iter()
        .filter(|row| row.status == OutboxStatus::Processing)
        .count();
    assert_eq!((claimed.len(), processing), (16, 16));
}
