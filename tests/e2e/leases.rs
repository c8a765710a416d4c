//! A send never starts after its lease could run out: with a slow Users and several relays,
//! no row is sent by two relays and no attempt is burned on a lease that ran out.

use std::{collections::HashMap, time::Duration};

use platform::failpoint::points;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use student_store::entity::outbox::OutboxStatus;

use crate::{
    on_both_backends,
    support::{
        Backend, eventually,
        invariants::{assert_each_student_linked_exactly_once, assert_linked_at_first_attempt},
        metrics::{sample, scrape},
        stack::{LINK_DEADLINE, Stack},
    },
};

on_both_backends!(
    slow_users_and_three_relays_spend_one_attempt_per_send,
    a_relay_stalled_past_its_lease_releases_its_rows_instead_of_sending_them_late,
    a_lease_with_less_left_than_a_call_may_take_sends_nothing,
    a_claim_kept_waiting_for_a_lock_counts_its_lease_from_before_the_wait,
);

/// A relay with a 5 s lease and 3 s calls: a row with 2 s or less of its lease left is not
/// sent. It serves metrics.
const SHORT_LEASE: &[&str] = &[
    "--lease",
    "5s",
    "--call-timeout",
    "3s",
    "--metrics-addr",
    "127.0.0.1:0",
];

/// How many create-user rows the relay serving metrics at `metrics` released unsent.
async fn released_rows(metrics: std::net::SocketAddr) -> f64 {
    sample(
        &scrape(metrics).await,
        "relay_deliveries_total",
        &[("effect", "create-user"), ("outcome", "released")],
    )
}

/// Failed sends per outbox row, from the relays' "delivery failed, will retry" lines.
fn failed_sends(relay_log: &str) -> HashMap<i64, i32> {
    let mut failed = HashMap::new();
    for line in relay_log
        .lines()
        .filter(|line| line.contains("delivery failed, will retry"))
    {
        let id = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix("outbox_id="))
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("no outbox_id in {line}"));
        *failed.entry(id).or_default() += 1;
    }
    failed
}

async fn slow_users_and_three_relays_spend_one_attempt_per_send(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Every call takes 400 ms, holding no lock, one row a call. Three relays with 4 rows
    // in flight each share 48 rows under a 3 s lease: a relay claims a row only for a free
    // call slot and sends it at once, so no row waits in a relay past its lease (were it
    // claimed 48 at a time and sent 4 at a time, the last would go out 4.8 s later, after
    // another relay had claimed it again).
    stack
        .restart_users(Some(&format!("{}=sleep(400)", points::USERS_ON_REQUEST)))
        .await;
    let students = 48;
    stack.create_students(0..students).await;
    let tuning = [
        "--batch-size",
        "64",
        "--concurrency",
        "4",
        "--lease",
        "3s",
        "--call-timeout",
        "2s",
        "--rows-per-call",
        "1",
    ];
    for _ in 0..3 {
        stack.start_relay(None, &tuning);
    }
    stack.wait_until_all_linked(students as u64).await;
    stack.stop_relays(Duration::from_secs(15));
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, students).await;

    // Each attempt is a claim; a row needs one more send than it had failed sends. A row
    // claimed while it waited for a call slot would show a second attempt with no failure.
    let failed = failed_sends(&stack.relay_log());
    for row in stack.outbox_rows().await {
        let needed = 1 + failed.get(&row.id).copied().unwrap_or(0);
        assert_eq!(
            row.attempts, needed,
            "row {} used {} attempts for {needed} sends",
            row.id, row.attempts
        );
    }
    let users = stack.log_of("users-svc");
    assert_eq!(
        users.matches("answered from the inbox").count(),
        0,
        "no key reached Users twice"
    );
    // And Users was slow: every call waited its 400 ms.
    assert!(
        users.matches("fail point: sleeping").count() >= students,
        "{users}"
    );
}

async fn a_relay_stalled_past_its_lease_releases_its_rows_instead_of_sending_them_late(
    backend: Backend,
) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..4).await;
    // Relay A (relay-1) claims the rows under a 2 s lease, then stalls for 2.5 s.
    stack.start_relay(
        Some(&format!("{}=1*sleep(2500)", points::RELAY_AFTER_CLAIM)),
        &[],
    );
    eventually("relay A to claim every row", LINK_DEADLINE, || async {
        let rows = stack.outbox_rows().await;
        rows.iter()
            .all(|row| row.status == OutboxStatus::Processing)
            .then_some(())
    })
    .await;
    // Relay B (relay-2) takes the rows once A's lease has run out, and delivers them.
    stack.start_relay(None, &[]);
    stack.wait_until_all_linked(4).await;
    // A wakes with too little lease left to send anything: it releases instead.
    stack
        .wait_for_log_lines("relay-1", "lease too short to send", 4)
        .await;
    stack.stop_relays(Duration::from_secs(15));
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
    let users = stack.log_of("users-svc");
    assert_eq!(
        users.matches("answered from the inbox").count(),
        0,
        "A never sent a row B was sending: no key reached Users twice"
    );
}

/// The guard itself: a row whose lease still runs, but for less than a call may take
/// (`--call-timeout`), is not sent. The relay (5 s lease, 3 s calls) stalls 2.5 s after
/// its claim, so each row has 2.5 s left: it releases all four (counted `released`, the
/// attempt handed back), claims them again with a fresh lease and sends each once. Both
/// ways a row is sent are guarded: in a CreateUsers call (the default) and alone
/// (`--rows-per-call 1`, as change rows are).
async fn a_lease_with_less_left_than_a_call_may_take_sends_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    let stall = format!("{}=1*sleep(2500)", points::RELAY_AFTER_CLAIM);
    for (round, rows_per_call) in [(1usize, "16"), (2, "1")] {
        let students = (round - 1) * 4..round * 4;
        stack.create_students(students.clone()).await;
        stack.start_relay(
            Some(&stall),
            &[SHORT_LEASE, &["--rows-per-call", rows_per_call]].concat(),
        );
        let relay_name = format!("relay-{round}");
        let metrics = stack.metrics_addr(&relay_name).await;
        stack
            .wait_for_log_lines(&relay_name, "lease too short to send", 4)
            .await;
        stack.wait_until_all_linked(students.end as u64).await;
        assert_eq!(
            released_rows(metrics).await,
            4.0,
            "--rows-per-call {rows_per_call}"
        );
        stack.kill_relays();
    }
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 8).await;
    // The released claims used no attempt.
    assert_linked_at_first_attempt(&stack.outbox_rows().await);
    assert_eq!(
        stack
            .log_of("users-svc")
            .matches("answered from the inbox")
            .count(),
        0,
        "each key reached Users once"
    );
}

/// The relay counts a lease from before its claim is sent, so it never ends later than
/// the lease the database records (`locked_until`: the lease added to a moment of the
/// claim), and never from when the answer came back: a claim kept waiting would otherwise
/// make the relay believe its rows stay its own for longer than the database says, and
/// send one while another relay may take it.
///
/// The test holds a write lock on the outbox (SQLite's one write lock; on PostgreSQL an
/// EXCLUSIVE table lock, which the claim's `FOR UPDATE` waits for) while the relay (5 s
/// lease, 3 s calls) tries to claim four rows, for 2.5 s after the claim is seen waiting.
/// Counted from before the wait, 2.5 s or less is left, less than a call may take: the
/// relay releases all four (counted `released`, the attempt handed back), then claims them
/// again and sends each once. Counted from the claim's answer, 5 s would seem left and it
/// would send them at once.
async fn a_claim_kept_waiting_for_a_lock_counts_its_lease_from_before_the_wait(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    stack.create_students(0..4).await;

    let lock = platform::db::begin_write(&stack.student_db)
        .await
        .expect("begin");
    if backend == Backend::Postgres {
        lock.execute_unprepared("LOCK TABLE outbox IN EXCLUSIVE MODE")
            .await
            .expect("lock the outbox");
    }
    stack.start_relay(None, SHORT_LEASE);
    let metrics = stack.metrics_addr("relay-1").await;
    // Logged just before the loop's first claim: a wait seen from now on includes the
    // claim's (the relay's schedule purging done rows may wait for the same lock first).
    stack
        .wait_for_log_lines("relay-1", "relay running", 1)
        .await;
    eventually(
        "the relay's claim to wait for the lock",
        LINK_DEADLINE,
        || async {
            let waiting = match backend {
                Backend::Sqlite => {
                    sample(&scrape(metrics).await, "sqlite_write_lock_waits_total", &[]) > 0.0
                }
                Backend::Postgres => claim_waits_for_the_outbox_lock(&stack.student_db).await,
            };
            waiting.then_some(())
        },
    )
    .await;
    // The stall is what the test sets up, not a wait for something: the claim started
    // before this moment and must stay blocked for 2.5 s past it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    lock.rollback().await.expect("release the lock");

    stack.wait_until_all_linked(4).await;
    // Every row of the stalled claim went back unsent (the next claim may too, should the
    // machine stall it as long: the rows are linked at attempt 1 either way).
    assert!(
        released_rows(metrics).await >= 4.0,
        "every row of the claim went back unsent"
    );
    stack
        .wait_for_log_lines("relay-1", "lease too short to send", 4)
        .await;
    stack.stop_relays(Duration::from_secs(15));
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, 4).await;
    // The released claim used no attempt.
    assert_linked_at_first_attempt(&stack.outbox_rows().await);
}

/// Whether the relay (PostgreSQL shows its connections as `relay`) waits for a lock on the
/// outbox table of this test's database.
async fn claim_waits_for_the_outbox_lock(db: &DatabaseConnection) -> bool {
    db.query_one_raw(Statement::from_string(
        DbBackend::Postgres,
        "SELECT EXISTS (SELECT 1 FROM pg_locks AS lock \
           JOIN pg_stat_activity AS backend ON backend.pid = lock.pid \
          WHERE lock.relation = 'outbox'::regclass AND NOT lock.granted \
            AND lock.database = (SELECT oid FROM pg_database \
                                  WHERE datname = current_database()) \
            AND backend.application_name = 'relay') AS waiting",
    ))
    .await
    .expect("read pg_locks")
    .expect("a row")
    .try_get("", "waiting")
    .expect("waiting")
}
