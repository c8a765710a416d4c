//! Several relays at once, and a soak under random SIGKILLs: each CreateUser effect
//! happens exactly once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use platform::failpoint::points;
use proto::student::v1::{DeactivateStudentRequest, GetStudentRequest, UpdateStudentRequest};

use crate::{
    on_both_backends,
    support::{
        Backend, invariants::assert_each_student_linked_exactly_once, stack::Stack, student_request,
    },
};

on_both_backends!(
    several_relays_deliver_each_effect_exactly_once,
    soak_with_random_kills_loses_and_duplicates_nothing,
    student_lives_reach_users_once_and_in_order_under_random_kills,
    relay_audit_while_two_relays_deliver_finds_nothing_wrong,
);

/// Short leases and small batches, so relays interleave and leases expire under load.
const CONTENDED: &[&str] = &[
    "--lease",
    "1s",
    "--call-timeout",
    "500ms",
    "--batch-size",
    "8",
    "--concurrency",
    "4",
];

async fn several_relays_deliver_each_effect_exactly_once(backend: Backend) {
    let relays = match backend {
        Backend::Postgres => 3,
        Backend::Sqlite => 2,
    };
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    // Calls take a little while, so no relay drains the backlog before the others start.
    stack
        .restart_users(Some(&format!("{}=sleep(20)", points::USERS_ON_REQUEST)))
        .await;
    // The backlog is there before any relay runs: they all compete for the same rows.
    let students = 300;
    stack.create_students(0..students).await;
    for _ in 0..relays {
        stack.start_relay(None, CONTENDED);
    }
    stack.wait_until_all_linked(students as u64).await;
    // Stopped before the final check, so a straggler cannot change anything after it.
    stack.stop_relays(Duration::from_secs(15));
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, students).await;
    stack.assert_audit_clean(students);
    assert!(
        stack
            .outbox_rows()
            .await
            .iter()
            .all(|row| row.locked_by.is_none()),
        "nothing left leased"
    );
    // Relays 1..=relays (relay-0 was the stack's first, killed before any student).
    for n in 1..=relays {
        let delivered = stack
            .relay_log_of(n)
            .matches("delivered and linked")
            .count();
        assert!(delivered > 0, "relay {n} delivered nothing");
    }
}

/// Seconds of chaos: `SOAK_SECONDS` (default 12, so CI stays quick; raise it locally).
fn soak_duration() -> Duration {
    let seconds = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    Duration::from_secs(seconds)
}

async fn soak_with_random_kills_loses_and_duplicates_nothing(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.start_relay(None, CONTENDED);

    // Students arrive continuously through student-svc, which stays up.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicUsize::new(0));
    let creator = tokio::spawn({
        let (stop, created, mut client) = (stop.clone(), created.clone(), stack.student_client());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let n = created.load(Ordering::Relaxed);
                client
                    .create_student(student_request(n))
                    .await
                    .expect("student-svc stays up");
                created.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(fastrand_ms(5, 30))).await;
            }
        }
    });

    let (mut relay_kills, mut users_kills) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < soak_duration() {
        tokio::time::sleep(Duration::from_millis(fastrand_ms(200, 1200))).await;
        if fastrand_ms(0, 3) == 0 {
            stack.kill_users();
            users_kills += 1;
            tokio::time::sleep(Duration::from_millis(fastrand_ms(0, 500))).await;
            stack.restart_users(None).await;
        } else {
            let victim = fastrand_ms(0, stack.relays.len() as u64) as usize;
            stack.relays.remove(victim).kill().expect("kill relay");
            relay_kills += 1;
            tokio::time::sleep(Duration::from_millis(fastrand_ms(0, 300))).await;
            stack.start_relay(None, CONTENDED);
        }
    }
    stop.store(true, Ordering::Relaxed);
    creator.await.expect("creator");
    let students = created.load(Ordering::Relaxed);
    stack.wait_until_all_linked(students as u64).await;
    stack.stop_relays(Duration::from_secs(15));
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, students).await;
    stack.assert_audit_clean(students);

    // From the relays' logs, for the report only: a relay killed right after a commit
    // never writes its log line, so these counts are not assertions.
    let log = stack.relay_log();
    let deliveries = log.matches("delivered and linked").count();
    let from_inbox = log.matches("from_inbox=true").count();
    eprintln!(
        "soak ({backend:?}, {:?}): {students} students, {relay_kills} relay kills, {users_kills} users-svc kills, \
         {deliveries} deliveries recorded, {from_inbox} answered from the inbox",
        soak_duration()
    );
}

async fn student_lives_reach_users_once_and_in_order_under_random_kills(backend: Backend) {
    let relays = match backend {
        Backend::Postgres => 3,
        Backend::Sqlite => 2,
    };
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    stack.kill_relays();
    for _ in 0..relays {
        stack.start_relay(None, CONTENDED);
    }
    let students = 30;
    let ids = stack.create_students(0..students).await;

    // Every student is renamed three times in a row, and every third one then deactivated,
    // through student-svc (which stays up) while relays and users-svc are killed at random.
    // Back to back, so several rows of one student wait at once and competing relays could
    // deliver them out of order, were it not for the per-student order of the claim.
    let changer = tokio::spawn({
        let mut client = stack.student_client();
        async move {
            for (n, id) in ids.iter().enumerate() {
                for round in 0..3 {
                    let student = client
                        .get_student(GetStudentRequest { id: id.clone() })
                        .await
                        .expect("found")
                        .into_inner();
                    client
                        .update_student(UpdateStudentRequest {
                            id: id.clone(),
                            first_name: format!("Round{round}-{n}"),
                            last_name: student.last_name,
                            email: format!("round{round}.{n}@example.edu"),
                            idempotency_key: Some(format!("rename-{round}-{n}")),
                            expected_version: student.version,
                        })
                        .await
                        .expect("updated");
                }
                if n % 3 == 0 {
                    client
                        .deactivate_student(DeactivateStudentRequest {
                            id: id.clone(),
                            idempotency_key: None,
                        })
                        .await
                        .expect("deactivated");
                }
            }
        }
    });

    let (mut relay_kills, mut users_kills) = (0, 0);
    while !changer.is_finished() || relay_kills + users_kills < 4 {
        tokio::time::sleep(Duration::from_millis(fastrand_ms(200, 900))).await;
        if fastrand_ms(0, 3) == 0 {
            stack.kill_users();
            users_kills += 1;
            tokio::time::sleep(Duration::from_millis(fastrand_ms(0, 400))).await;
            stack.restart_users(None).await;
        } else {
            let victim = fastrand_ms(0, stack.relays.len() as u64) as usize;
            stack.relays.remove(victim).kill().expect("kill relay");
            relay_kills += 1;
            stack.start_relay(None, CONTENDED);
        }
    }
    changer.await.expect("changer");
    stack.wait_until_all_synced(students as u64).await;
    stack.stop_relays(Duration::from_secs(15));
    // Users shows every student as it is now, at its version; each effect ran once, in
    // version order (the invariant checks the inbox's execution times per student).
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, students).await;
    stack.assert_audit_clean(students);
    eprintln!(
        "ordering under chaos ({backend:?}): {students} students, {relay_kills} relay kills, \
         {users_kills} users-svc kills"
    );
}

/// A random number of milliseconds in `[low, high)`.
fn fastrand_ms(low: u64, high: u64) -> u64 {
    low + (uuid::Uuid::new_v4().as_u128() % u128::from(high - low)) as u64
}

/// `relay audit` reads only and is safe while relays run (README): a row is marked `done`
/// in the transaction that links its student, and the audit reads the rows before the
/// links, so a delivery finishing mid-audit is never a problem. Two relays drain a backlog
/// of 300 through a slowed Users while audits run back to back: each must check every
/// student and report nothing, and at least two must have run mid-drain.
async fn relay_audit_while_two_relays_deliver_finds_nothing_wrong(backend: Backend) {
    let Some(mut stack) = Stack::start(backend).await else {
        return;
    };
    const STUDENTS: usize = 300;
    stack.kill_relays();
    stack.create_students(0..STUDENTS).await;
    stack
        .restart_users(Some(&format!("{}=sleep(30)", points::USERS_ON_REQUEST)))
        .await;
    for _ in 0..2 {
        stack.start_relay(None, &["--concurrency", "4", "--rows-per-call", "1"]);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut audits_mid_drain = 0;
    loop {
        let linked_before = stack.linked_students().await;
        stack.assert_audit_clean(STUDENTS);
        let linked_after = stack.linked_students().await;
        if linked_after == STUDENTS as u64 {
            break;
        }
        if linked_after > linked_before {
            audits_mid_drain += 1;
        }
        assert!(Instant::now() < deadline, "the drain did not finish");
    }
    assert!(
        audits_mid_drain >= 2,
        "only {audits_mid_drain} audits ran while rows were being linked"
    );
    assert_each_student_linked_exactly_once(&stack.student_db, &stack.users_db, STUDENTS).await;
}
