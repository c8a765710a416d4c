//! One measurement each: a fresh system, a load, what the rows and the processes say.

use std::time::Duration;

use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend};
use serde::{Deserialize, Serialize};

use crate::{
    load::{self, Calls},
    rows::{self, Links, RunRows, Stages},
    stats::ProcessCost,
    system::{Backend, Options, System},
};

/// How long delivery may take before a run gives up.
const LINK_TIMEOUT: Duration = Duration::from_secs(600);

/// A closed-loop run: `students` CreateStudents, `in_flight` at a time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClosedRun {
    pub link_mode: String,
    pub relays: usize,
    pub in_flight: usize,
    pub create: Calls,
    /// Students per CreateStudent transaction, on average (student-svc's group commit);
    /// PostgreSQL only, and only in outbox mode with no relay.
    pub students_per_commit: Option<f64>,
    /// With no relay, none: the run measures CreateStudent alone.
    pub links: Option<Links>,
    pub processes: Vec<ProcessCost>,
}

pub async fn closed(
    backend: &Backend,
    env: &[(String, String)],
    link_mode: &str,
    relays: usize,
    students: usize,
    in_flight: usize,
) -> anyhow::Result<ClosedRun> {
    let options = Options {
        relays,
        link_mode: link_mode.to_owned(),
        env: env.to_vec(),
    };
    let system = System::start(backend, &options).await?;
    let result = async {
        let client = load::client(&system.running.student).await?;
        let db = platform::db::connect(&system.running.student_database_url).await?;
        let run = RunRows::start();
        let create = load::closed_loop(&client, &run.id, students, in_flight).await;
        // With a relay running, its finalize rewrites the students it links and their
        // `xmin` names its transaction instead.
        let students_per_commit = if link_mode == "outbox" && relays == 0 {
            rows::students_per_commit(&db, &run).await?
        } else {
            None
        };
        let links = if relays > 0 && link_mode == "outbox" {
            let expected = create.calls - create.errors;
            rows::wait_until_done(&db, &run, expected, LINK_TIMEOUT).await?;
            Some(rows::links(&rows::done_rows(&db, &run).await?, None))
        } else {
            None
        };
        let processes = system.costs();
        db.close().await.ok();
        anyhow::Ok(ClosedRun {
            link_mode: link_mode.to_owned(),
            relays,
            in_flight,
            create,
            students_per_commit,
            links,
            processes,
        })
    }
    .await;
    system.stop().await;
    result
}

/// An open-loop run: CreateStudents at `rate` for `duration`, one relay delivering.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenRun {
    pub rate: f64,
    pub seconds: f64,
    pub create: Calls,
    pub links: Links,
    #[serde(default)]
    pub stages: Stages,
    pub processes: Vec<ProcessCost>,
}

pub async fn open(
    backend: &Backend,
    env: &[(String, String)],
    rate: f64,
    duration: Duration,
) -> anyhow::Result<OpenRun> {
    let options = Options {
        relays: 1,
        link_mode: "outbox".into(),
        env: env.to_vec(),
    };
    let system = System::start(backend, &options).await?;
    let result = async {
        let client = load::client(&system.running.student).await?;
        let db = platform::db::connect(&system.running.student_database_url).await?;
        let run = RunRows::start();
        let create = load::open_loop(&client, &run.id, rate, duration).await;
        let expected = create.calls - create.errors;
        rows::wait_until_done(&db, &run, expected, LINK_TIMEOUT).await?;
        let done = rows::done_rows(&db, &run).await?;
        let links = rows::links(&done, None);
        // A running system's Users DB is optional: without it, no stages.
        let stages = match &system.running.users_database_url {
            Some(url) => {
                let users_db = platform::db::connect(url).await?;
                let stages = rows::stages(&done, &users_db, run.since).await?;
                users_db.close().await.ok();
                stages
            }
            None => Stages::default(),
        };
        let processes = system.costs();
        db.close().await.ok();
        anyhow::Ok(OpenRun {
            rate,
            seconds: duration.as_secs_f64(),
            create,
            links,
            stages,
            processes,
        })
    }
    .await;
    system.stop().await;
    result
}

/// A backlog drain: `students` rows written with no relay running, then `relays` relays
/// started together; the rate counts from their start to the last row done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainRun {
    pub relays: usize,
    pub backlog: usize,
    pub links: Links,
    pub processes: Vec<ProcessCost>,
}

pub async fn drain(
    backend: &Backend,
    env: &[(String, String)],
    students: usize,
    relays: usize,
) -> anyhow::Result<DrainRun> {
    let options = Options {
        relays: 0,
        link_mode: "outbox".into(),
        env: env.to_vec(),
    };
    let mut system = System::start(backend, &options).await?;
    let result = async {
        let client = load::client(&system.running.student).await?;
        let db = platform::db::connect(&system.running.student_database_url).await?;
        let run = RunRows::start();
        let create = load::closed_loop(&client, &run.id, students, 32).await;
        anyhow::ensure!(
            create.errors == 0,
            "{} CreateStudents failed",
            create.errors
        );
        settle(&db).await?;
        let started = platform::db::now();
        system.start_relays(relays)?;
        rows::wait_until_done(&db, &run, students, LINK_TIMEOUT).await?;
        let links = rows::links(&rows::done_rows(&db, &run).await?, Some(started));
        let processes = system.costs();
        db.close().await.ok();
        anyhow::Ok(DrainRun {
            relays,
            backlog: students,
            links,
            processes,
        })
    }
    .await;
    system.stop().await;
    result
}

/// Gives the backlog's database what a running one has. A real backlog builds up over
/// minutes (while Users is down), and autovacuum vacuums and analyzes a new table within a
/// minute of its first thousand rows; written in seconds into a new database, the outbox has
/// no statistics yet, and PostgreSQL plans each claim as a sort of every due row
/// (BENCHMARKS-JOURNAL.md, "Claims after a quiet spell"). SQLite gathers none unless asked,
/// on both sides.
async fn settle(db: &DatabaseConnection) -> anyhow::Result<()> {
    if db.get_database_backend() == DbBackend::Postgres {
        db.execute_unprepared("VACUUM ANALYZE outbox").await?;
    }
    Ok(())
}
