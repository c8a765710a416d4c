//! What the database alone does on the project's own schema, measured in the same run as
//! the system, so every system number is printed as a ratio to it.
//!
//! - `library`: the very functions the services run (the CreateStudent transaction, the
//!   CreateUser transaction with its inbox lookup, the relay's fenced finalize), called
//!   directly on fresh databases by concurrent tasks: no gRPC, no processes. Both backends.
//! - `pgbench` (PostgreSQL): the same statements as SQL scripts in `bench/pgbench/`, driven
//!   by `pgbench -M prepared`, the database with nothing of ours in front of it.
//!
//! The drain ceiling runs the Users transaction and the link transaction at the same time,
//! `clients` each, on their two databases; a row needs both, so it is the lower of the two.

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
use sea_orm::{ConnectionTrait as _, DatabaseConnection};
use serde::Serialize;
use student_store::{
    outbox::{self, Delivered},
    students::{self, NewStudentRow},
    wake::{RelayBell, WakeRelays},
};
use users_svc::{answer_cache::AnswerCache, create_user, inbox::Mode};
use uuid::Uuid;

use crate::system::{Backend, Databases};

/// Transactions per second the database sustains for each of the system's transactions.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Ceiling {
    /// Student + create-user outbox row (CreateStudent).
    pub create_per_second: f64,
    /// User + inbox row (CreateUser), while the link transaction runs too.
    pub users_per_second: f64,
    /// Fenced finalize: row done + student linked (the relay), while CreateUser runs too.
    pub link_per_second: f64,
    /// A row needs both: the lower of the two.
    pub drain_per_second: f64,
    /// CreateStudent's transaction with the `NOTIFY` inside it (`--wake-relays
    /// in-transaction`); pgbench only.
    #[serde(default)]
    pub create_notify_in_transaction_per_second: Option<f64>,
}

impl Ceiling {
    /// A ceiling from its measured rates; the drain is the lower of the two it needs.
    fn new(create: f64, users: f64, link: f64, create_notify_in_transaction: Option<f64>) -> Self {
        Self {
            create_per_second: create,
            users_per_second: users,
            link_per_second: link,
            drain_per_second: link.min(users),
            create_notify_in_transaction_per_second: create_notify_in_transaction,
        }
    }
}

/// The `library` ceiling: the project's own transaction functions, `clients` at a time,
/// each for `seconds`.
pub async fn library(backend: &Backend, clients: usize, seconds: u64) -> anyhow::Result<Ceiling> {
    let databases = Databases::create(backend).await?;
    let student_db =
        migrations::open::<migrations::student::Migrator>(&databases.student_url, 16).await?;
    let users_db =
        migrations::open::<migrations::users::Migrator>(&databases.users_url, 16).await?;
    let duration = Duration::from_secs(seconds);

    // Rung as student-svc rings it by default.
    let bell = RelayBell::new(&student_db, WakeRelays::default());
    let create_per_second = for_each_client(clients, duration, {
        let db = student_db.clone();
        move |n| {
            let db = db.clone();
            let bell = bell.clone();
            async move {
                students::create(&db, &bell, new_student(n))
                    .await
                    .map(drop)
                    .map_err(anyhow::Error::from)
            }
        }
    })
    .await?;

    // Rows to finalize: written and claimed ahead, outside the measured time.
    let backlog = (create_per_second * seconds as f64 * 2.0) as usize + 1_000;
    let claimed = claimed_rows(&student_db, backlog).await?;
    let claimed = Arc::new(claimed);
    let next = Arc::new(AtomicUsize::new(0));
    let links = for_each_client(clients, duration, {
        let db = student_db.clone();
        move |_| {
            let (db, claimed, next) = (db.clone(), claimed.clone(), next.clone());
            async move {
                let Some(row) = claimed.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    anyhow::bail!("the backlog ran out: raise it");
                };
                outbox::record_delivery(
                    &db,
                    row,
                    BENCH_RELAY,
                    Delivered::UserCreated(Uuid::now_v7()),
                )
                .await
                .map_err(anyhow::Error::from)
            }
        }
    });
    let users = for_each_client(clients, duration, {
        let db = users_db.clone();
        move |n| {
            let db = db.clone();
            async move {
                create_user::create_user(&db, &AnswerCache::off(), new_user(n), Mode::Execute)
                    .await
                    .map(drop)
                    .map_err(|err| anyhow::anyhow!("{err:?}"))
            }
        }
    });
    let (link_per_second, users_per_second) = tokio::try_join!(links, users)?;
    student_db.close().await.ok();
    users_db.close().await.ok();
    databases.remove().await;
    Ok(Ceiling::new(
        create_per_second,
        users_per_second,
        link_per_second,
        None,
    ))
}

/// The `pgbench` ceiling on PostgreSQL: the scripts in `bench/pgbench/`, `clients` at a
/// time, each for `seconds`, on fresh databases with the project's schema.
pub async fn pgbench(admin_url: &str, clients: usize, seconds: u64) -> anyhow::Result<Ceiling> {
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
            clients,
            seconds,
            &[],
        )
    };
    let create_per_second = create("create_student.sql")?;
    // The transaction with the NOTIFY inside it (`--wake-relays in-transaction`).
    let create_notify_in_transaction_per_second = create("create_student_notify.sql")?;
    let rows = 200_000;
    student_db
        .execute_unprepared(
            &std::fs::read_to_string(scripts.join("claimed_backlog.sql"))?
                .replace(":rows", &rows.to_string()),
        )
        .await
        .context("the backlog for the link script")?;
    let (student_url, users_url) = (databases.student_url.clone(), databases.users_url.clone());
    let (link, users) = (scripts.join("link.sql"), scripts.join("create_user.sql"));
    let rows_define = format!("rows={rows}");
    let links = std::thread::spawn(move || {
        run_pgbench(&student_url, &link, clients, seconds, &["-D", &rows_define])
    });
    let users_per_second = run_pgbench(&users_url, &users, clients, seconds, &[])?;
    let link_per_second = links
        .join()
        .map_err(|_| anyhow::anyhow!("the link pgbench panicked"))??;
    student_db.close().await.ok();
    users_db.close().await.ok();
    databases.remove().await;
    Ok(Ceiling::new(
        create_per_second,
        users_per_second,
        link_per_second,
        Some(create_notify_in_transaction_per_second),
    ))
}

/// `locked_by` of the rows the library ceiling finalizes.
const BENCH_RELAY: &str = "bench";

/// Writes `count` students with their create-user rows and claims them all for
/// [`BENCH_RELAY`], as a relay would before finalizing them.
async fn claimed_rows(
    db: &DatabaseConnection,
    count: usize,
) -> anyhow::Result<Vec<student_store::entity::outbox::Model>> {
    let written = for_each_n(16, count, |n| {
        let db = db.clone();
        async move {
            students::create(&db, &RelayBell::silent(), new_student(1_000_000_000 + n))
                .await
                .map(drop)
        }
    });
    written.await?;
    let mut claimed = Vec::with_capacity(count);
    loop {
        let batch = outbox::claim_batch(db, BENCH_RELAY, 1_000, Duration::from_secs(3600)).await?;
        if batch.is_empty() {
            return Ok(claimed);
        }
        claimed.extend(batch);
    }
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
/// them; returns completed operations per second.
async fn for_each_client<F, Fut>(
    clients: usize,
    duration: Duration,
    operation: F,
) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
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
                    operation(n).await?;
                    done += 1;
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

/// Runs `operation(n)` for n in 0..count on `clients` concurrent tasks.
async fn for_each_n<F, Fut>(clients: usize, count: usize, operation: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut + Clone,
    Fut: std::future::Future<Output = Result<(), sea_orm::DbErr>>,
{
    use futures::StreamExt as _;
    let results: Vec<_> = futures::stream::iter(0..count)
        .map(operation)
        .buffer_unordered(clients)
        .collect()
        .await;
    results.into_iter().collect::<Result<(), _>>()?;
    Ok(())
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
