//! What the database alone does on the project's own schema, measured in the same run as
//! the system, so every system number is printed as a ratio to it.
//!
//! - `library`: the very functions the services run (CreateStudent, CreateUser, the
//!   relay's claim and group commit), called directly on fresh databases by concurrent
//!   tasks: no gRPC, no processes. Both backends.
//! - `pgbench` (PostgreSQL): the same statements as SQL scripts in `bench/pgbench/`, driven
//!   by `pgbench -M prepared`, the database with nothing of ours in front of it.
//!
//! The drain ceiling: a row needs its user written on the Users DB (as a draining relay
//! sends them, [`USERS_PER_CALL`] rows a CreateUsers transaction) and the relay's Student
//! side (its claim and its group commit, in batches of [`LINK_BATCH`]). The Users side runs
//! alone first; then both run at the same time at that pace, `drain_clients` each, and the
//! ceiling is the lower of the two rates they reach together. CreateUser one row a
//! transaction is measured alone too, for comparison.

use std::{
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};
use serde::Serialize;
use student_store::{
    outbox::{self, Delivered},
    students::{self, NewStudentRow},
    wake::{RelayBell, WakeRelays},
};
use users_svc::{answer_cache::AnswerCache, create_user, create_users, inbox::Mode};
use uuid::Uuid;

use crate::system::{Backend, Databases};

/// Transactions per second the database sustains for each of the system's transactions.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Ceiling {
    /// Student + create-user outbox row (CreateStudent).
    pub create_per_second: f64,
    /// Users + inbox rows, [`USERS_PER_CALL`] a transaction (CreateUsers), rows per second,
    /// while the link transaction runs too.
    pub users_per_second: f64,
    /// User + inbox row one a transaction (CreateUser), alone: rows per second.
    #[serde(default)]
    pub create_user_alone_per_second: Option<f64>,
    /// The relay's Student side (claims and group commits), rows per second, while
    /// CreateUser runs too.
    pub link_per_second: f64,
    /// A row needs both: the fastest pace both keep up with together.
    pub drain_per_second: f64,
    /// CreateStudent's transaction with the `NOTIFY` inside it (`--wake-relays
    /// in-transaction`); pgbench only.
    #[serde(default)]
    pub create_notify_in_transaction_per_second: Option<f64>,
}

/// The `library` ceiling: the project's own transaction functions, each for `seconds`:
/// CreateStudent `create_clients` at a time, then CreateUser and the link `drain_clients`
/// at a time each.
pub async fn library(
    backend: &Backend,
    create_clients: usize,
    drain_clients: usize,
    seconds: u64,
) -> anyhow::Result<Ceiling> {
    let databases = Databases::create(backend).await?;
    let student_db =
        migrations::open::<migrations::student::Migrator>(&databases.student_url, 16).await?;
    let users_db =
        migrations::open::<migrations::users::Migrator>(&databases.users_url, 16).await?;
    let duration = Duration::from_secs(seconds);

    // Rung as student-svc rings it by default.
    let bell = RelayBell::new(&student_db, WakeRelays::default());
    let create_per_second = for_each_client(create_clients, duration, {
        let db = student_db.clone();
        move |n| {
            let db = db.clone();
            let bell = bell.clone();
            async move {
                students::create(&db, &bell, new_student(n))
                    .await
                    .map(|_| 1)
                    .map_err(anyhow::Error::from)
            }
        }
    })
    .await?;

    // Rows to link: written ahead, outside the measured time. Each operation is the
    // relay's Student side of a batch: a claim of up to LINK_BATCH due rows, then the group
    // commit that records them all (the answers made up here, as Users would give them).
    let backlog = 50_000 * usize::try_from(seconds.max(1))?;
    due_rows(&student_db, backlog).await?;
    let create_user_alone_per_second = for_each_client(drain_clients, duration, {
        let db = users_db.clone();
        move |n| {
            let db = db.clone();
            async move {
                create_user::create_user(&db, &AnswerCache::off(), new_user(n), Mode::Execute)
                    .await
                    .map(|_| 1)
                    .map_err(|err| anyhow::anyhow!("{err:?}"))
            }
        }
    })
    .await?;
    // As a draining relay sends them: USERS_PER_CALL users a call, one transaction.
    let create_users = {
        let db = users_db.clone();
        move |n: usize| {
            let db = db.clone();
            let items = (0..USERS_PER_CALL)
                .map(|i| create_users::Item {
                    new: Ok(new_user(n * USERS_PER_CALL + i)),
                    mode: Mode::Execute,
                    trace: platform::trace::TraceContext::new_root(),
                })
                .collect();
            async move {
                let answers = create_users::create_users(&db, &AnswerCache::off(), items)
                    .await
                    .map_err(|err| anyhow::anyhow!("{err:?}"))?;
                anyhow::ensure!(
                    answers.iter().all(Result::is_ok),
                    "a CreateUsers item failed: {answers:?}"
                );
                Ok(answers.len())
            }
        }
    };
    let users_alone = for_each_client(drain_clients, duration, create_users.clone()).await?;
    let (drain_per_second, users_per_second, link_per_second) = common_pace(users_alone, |pace| {
        let batch_interval = Duration::from_secs_f64(f64::from(LINK_BATCH) / pace.max(1.0));
        let paced_from = tokio::time::Instant::now();
        let links = for_each_client(drain_clients, duration, {
            let db = student_db.clone();
            move |n| {
                let db = db.clone();
                let due = paced_from + batch_interval * u32::try_from(n).unwrap_or(u32::MAX);
                async move {
                    tokio::time::sleep_until(due).await;
                    link_a_batch(&db).await
                }
            }
        });
        let users = for_each_client(drain_clients, duration, create_users.clone());
        async move {
            let (link, users) = tokio::try_join!(links, users)?;
            Ok((users, link))
        }
    })
    .await?;
    student_db.close().await.ok();
    users_db.close().await.ok();
    databases.remove().await;
    Ok(Ceiling {
        create_per_second,
        users_per_second,
        create_user_alone_per_second: Some(create_user_alone_per_second),
        link_per_second,
        drain_per_second,
        create_notify_in_transaction_per_second: None,
    })
}

/// The `pgbench` ceiling on PostgreSQL: the scripts in `bench/pgbench/`, each for
/// `seconds`, on fresh databases with the project's schema: CreateStudent's
/// `create_clients` at a time, CreateUser's and the link's `drain_clients` at a time each.
pub async fn pgbench(
    admin_url: &str,
    create_clients: usize,
    drain_clients: usize,
    seconds: u64,
) -> anyhow::Result<Ceiling> {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/pgbench");
    let databases = Databases::create(&Backend::Postgres {
        admin_url: admin_url.to_owned(),
    })
    .await?;
    let student_db =
        migrations::open::<migrations::student::Migrator>(&databases.student_url, 16).await?;
    let users_db =
        migrations::open::<migrations::users::Migrator>(&databases.users_url, 16).await?;

    let create = |script: &str| {
        run_pgbench(
            &databases.student_url,
            &scripts.join(script),
            create_clients,
            seconds,
            &[],
        )
    };
    let create_per_second = create("create_student.sql")?;
    // The transaction with the NOTIFY inside it (`--wake-relays in-transaction`).
    let create_notify_in_transaction_per_second = create("create_student_notify.sql")?;
    // Enough due rows that the link script never runs out in the three paced runs (it links
    // about 16,000 a second alone, 8 clients, on the 2-core machine of BENCHMARKS.md);
    // checked below.
    let rows = 50_000 * seconds.max(1);
    student_db
        .execute_unprepared(
            &std::fs::read_to_string(scripts.join("backlog.sql"))?
                .replace(":rows", &rows.to_string()),
        )
        .await
        .context("the backlog for the link script")?;
    student_db
        .execute_unprepared("VACUUM ANALYZE outbox")
        .await
        .context("statistics for the backlog")?;
    let (student_url, users_url) = (databases.student_url.clone(), databases.users_url.clone());
    let create_user_alone_per_second = run_pgbench(
        &users_url,
        &scripts.join("create_user.sql"),
        drain_clients,
        seconds,
        &[],
    )?;
    let (link, users) = (scripts.join("link.sql"), scripts.join("create_users.sql"));
    // The Users script writes USERS_PER_CALL rows a transaction, the link script claims and
    // records up to LINK_BATCH (each number is written in its script); the link is held to
    // a pace with `-R`, and its rate is counted in rows, from the rows it left `done`.
    let users_alone = users_rows_per_second(&users_url, &users, drain_clients, seconds)?;
    let (drain_per_second, users_per_second, link_per_second) = common_pace(users_alone, |pace| {
        let (student_db, student_url, users_url) =
            (student_db.clone(), student_url.clone(), users_url.clone());
        let (link, users) = (link.clone(), users.clone());
        async move {
            let done = "SELECT COUNT(*) FROM outbox WHERE status = 'done'";
            let before = count(&student_db, done).await?;
            let batches_per_second = format!("{:.0}", pace / f64::from(LINK_BATCH));
            let links = std::thread::spawn(move || {
                let paced = ["-R", batches_per_second.as_str()];
                run_pgbench(&student_url, &link, drain_clients, seconds, &paced)
            });
            let users = users_rows_per_second(&users_url, &users, drain_clients, seconds)?;
            links
                .join()
                .map_err(|_| anyhow::anyhow!("the link pgbench panicked"))??;
            let linked = count(&student_db, done).await?;
            anyhow::ensure!(
                linked < rows,
                "the link script ran out of due rows: raise the backlog"
            );
            Ok((users, (linked - before) as f64 / seconds as f64))
        }
    })
    .await?;
    student_db.close().await.ok();
    users_db.close().await.ok();
    databases.remove().await;
    Ok(Ceiling {
        create_per_second,
        users_per_second,
        create_user_alone_per_second: Some(create_user_alone_per_second),
        link_per_second,
        drain_per_second,
        create_notify_in_transaction_per_second: Some(create_notify_in_transaction_per_second),
    })
}

/// The fastest pace, in rows per second, at which CreateUser and the link keep up with each
/// other while running together: a drain can go no faster. `together(pace)` runs both for
/// the measured time, the link held to `pace`, and returns the rates (CreateUser, link)
/// they reached. CreateUser alone (`alone`) bounds the pace from above. A run in which both
/// came within 3 % of the pace shows that pace is possible; in a run where one fell behind,
/// the lower of the two rates stands as possible (the link held to it leaves CreateUser at
/// least the share it had). Three runs, halving the gap between the two. Returns the pace
/// and the rates of the run that showed it.
async fn common_pace<F, Fut>(alone: f64, mut together: F) -> anyhow::Result<(f64, f64, f64)>
where
    F: FnMut(f64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(f64, f64)>>,
{
    let (mut kept, mut missed, mut rates) = (0.0_f64, alone, (0.0, 0.0));
    let mut pace = alone;
    for _ in 0..3 {
        let (users, link) = together(pace).await?;
        let reached = users.min(link);
        if reached >= pace * 0.97 {
            (kept, rates) = (pace, (users, link));
        } else {
            missed = pace;
            if reached > kept {
                (kept, rates) = (reached, (users, link));
            }
        }
        pace = (kept + missed) / 2.0;
    }
    Ok((kept, rates.0, rates.1))
}

/// The relay's Student side of one batch: a claim of up to [`LINK_BATCH`] due rows, then the
/// group commit that records them all (the answers made up, as Users would give them).
/// Returns the rows recorded.
async fn link_a_batch(db: &DatabaseConnection) -> anyhow::Result<usize> {
    let rows = outbox::claim_batch(db, BENCH_RELAY, LINK_BATCH, Duration::from_secs(3600)).await?;
    anyhow::ensure!(!rows.is_empty(), "the backlog ran out: raise it");
    let answers: Vec<_> = rows
        .into_iter()
        .map(|row| (row, Delivered::UserCreated(Uuid::now_v7())))
        .collect();
    let recorded = outbox::record_deliveries(db, BENCH_RELAY, &answers).await?;
    Ok(recorded
        .results
        .iter()
        .filter(|result| result.is_ok())
        .count())
}

/// The one number `sql` selects.
async fn count(db: &DatabaseConnection, sql: &str) -> anyhow::Result<u64> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .context("a count")?;
    Ok(u64::try_from(row.try_get_by_index::<i64>(0)?)?)
}

/// Users per CreateUsers transaction in the drain ceilings (`bench/pgbench/create_users.sql`
/// says 16 too): relay `--rows-per-call`'s default.
pub(crate) const USERS_PER_CALL: usize = 16;

/// Rows per claim of the link ceilings (`bench/pgbench/link.sql` says 32 too): a claim
/// when a quarter of the relay's 128 call slots is free.
const LINK_BATCH: u32 = 32;

/// `locked_by` of the rows the library ceiling finalizes.
const BENCH_RELAY: &str = "bench";

/// Writes `count` students with their create-user rows, all due, two statements in all
/// (the ceiling links faster than CreateStudent writes, so the backlog is written in bulk).
async fn due_rows(db: &DatabaseConnection, count: usize) -> anyhow::Result<()> {
    let backend = db.get_database_backend();
    let (series, new_id, new_key) = match backend {
        DbBackend::Postgres => (
            format!("generate_series(1, {count}) AS seq(n)"),
            "gen_random_uuid()",
            "gen_random_uuid()::text",
        ),
        _ => (
            format!(
                "(WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq \
                   WHERE n < {count}) SELECT n FROM seq) AS seq"
            ),
            "randomblob(16)",
            "lower(hex(randomblob(16)))",
        ),
    };
    let students = format!(
        "INSERT INTO students (id, first_name, last_name, email, document_number, request_hash, \
           created_at, updated_at, version, synced_version, active) \
         SELECT {new_id}, 'Load', 'Student', 'load@example.edu', 'B' || seq.n, 'hash', $1, $1, \
           1, 0, true FROM {series}"
    );
    let outbox = format!(
        "INSERT INTO outbox (aggregate_id, aggregate_version, effect_type, payload, \
           idempotency_key, status, attempts, available_at, created_at) \
         SELECT id, 1, 'create-user', '{{\"version\":1}}', {new_key}, 'pending', 0, $1, $1 \
           FROM students WHERE document_number LIKE 'B%'"
    );
    // Due a second ago, by the same clock the claim compares with.
    let at = platform::db::now() - chrono::TimeDelta::seconds(1);
    for sql in [students, outbox] {
        db.execute_raw(Statement::from_sql_and_values(backend, sql, [at.into()]))
            .await
            .context("the backlog")?;
    }
    // As a running outbox has: statistics (see `settle` in runs.rs).
    if backend == DbBackend::Postgres {
        db.execute_unprepared("VACUUM ANALYZE outbox").await?;
    }
    Ok(())
}

fn new_student(n: usize) -> NewStudentRow {
    NewStudentRow {
        id: Uuid::now_v7(),
        first_name: "Load".into(),
        last_name: format!("Student{n}"),
        email: format!("load.{n}@example.edu"),
        document_number: format!("C{n}"),
        client_key: Some(format!("ceiling-{n}")),
        request_hash: "0".repeat(64),
        created_at: platform::db::now(),
        traceparent: platform::trace::TraceContext::new_root().to_string(),
    }
}

fn new_user(n: usize) -> users_svc::NewUser {
    users_svc::NewUser {
        idempotency_key: Uuid::new_v4().to_string(),
        email: format!("load.{n}@example.edu"),
        first_name: "Load".into(),
        last_name: format!("User{n}"),
        document_number: format!("U{n}-{}", &Uuid::new_v4().simple().to_string()[..12]),
        student_id: Uuid::now_v7(),
    }
}

/// Runs `operation(n)` on `clients` concurrent tasks for `duration`, n counting up across
/// them; returns what the operations did per second (each returns how many rows it
/// wrote).
async fn for_each_client<F, Fut>(
    clients: usize,
    duration: Duration,
    operation: F,
) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<usize>> + Send,
{
    let counter = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..clients.max(1))
        .map(|_| {
            let (operation, counter) = (operation.clone(), counter.clone());
            tokio::spawn(async move {
                let mut done = 0usize;
                while Instant::now() < deadline {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    done += operation(n).await?;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Runs the Users script (`create_users.sql`, [`USERS_PER_CALL`] users a transaction) and
/// returns the users it wrote per second.
fn users_rows_per_second(
    url: &str,
    script: &Path,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<f64> {
    Ok(run_pgbench(url, script, clients, seconds, &[])? * USERS_PER_CALL as f64)
}

/// Runs one pgbench script and returns its transactions per second.
fn run_pgbench(
    url: &str,
    script: &Path,
    clients: usize,
    seconds: u64,
    extra: &[&str],
) -> anyhow::Result<f64> {
    let output = Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
        ])
        .args(["-T", &seconds.to_string(), "-f"])
        .arg(script)
        .args(extra)
        .arg(url)
        .output()
        .context("cannot run pgbench (Debian: postgresql-client)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench {} failed: {}{}",
        script.display(),
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where one side falls behind, the slower rate stands as possible, not the faster.
    #[tokio::test]
    async fn a_pace_one_side_cannot_keep_is_judged_by_the_slower_side() {
        let (pace, users, link) = common_pace(1000.0, |pace| async move {
            Ok((pace.min(1000.0), pace.min(500.0)))
        })
        .await
        .expect("paced");
        assert!((485.0..=500.0).contains(&pace), "{pace}");
        assert!(link <= 500.0 && users >= link, "{users} {link}");
    }

    /// The pgbench Users script writes as many users a transaction as the library
    /// ceiling and the suite count with (the relay's `--rows-per-call` default).
    #[test]
    fn the_pgbench_users_script_writes_users_per_call_a_transaction() {
        let script = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../bench/pgbench/create_users.sql"),
        )
        .expect("the script");
        let series = format!("generate_series(1, {USERS_PER_CALL})");
        assert_eq!(script.matches(&series).count(), 2, "{script}");
        assert_eq!(script.matches("generate_series(").count(), 2, "{script}");
    }
}
