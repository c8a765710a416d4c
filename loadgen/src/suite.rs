//! The command line, and what each mode runs and prints.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    ceiling::{self, Ceiling},
    replay_cost::ReplayCost,
    runs,
    stats::{ProcessCost, ratio},
    system::{Backend, Running},
};

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "Measures the system: starts it on fresh databases, drives it, reads the rows"
)]
pub struct Cli {
    /// `sqlite` (files in a temporary directory) or a PostgreSQL maintenance URL such as
    /// `postgres://postgres@127.0.0.1:5432/postgres` (fresh databases are created and
    /// dropped through it).
    #[arg(long, default_value = "sqlite", global = true)]
    pub backend: String,
    /// Also write the results as JSON here.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// Extra environment for every binary, `NAME=VALUE` (e.g. `RELAY_CONCURRENCY=32`).
    /// `RUST_LOG` defaults to `info`; another level keeps the line a service logs once it
    /// listens (`listening=info` is added), which tells loadgen its port.
    #[arg(long = "env", global = true)]
    pub env: Vec<String>,
    /// Measure a system already running instead of starting one: its student-svc
    /// (`http://HOST:PORT`, or `https://HOST:PORT` for TLS, see `--tls-ca`). `closed`,
    /// `open` and `replay-cost` only; loadgen
    /// starts, stops and drops nothing, and finds its own rows among any others by their
    /// keys. The relays are the running system's own (`closed --relays 0`: none to wait for).
    #[arg(long, global = true, requires = "student_database_url")]
    pub student_url: Option<String>,
    /// With `--student-url`: its Student DB, whose outbox rows give link latency.
    #[arg(long, global = true)]
    pub student_database_url: Option<String>,
    /// With `--student-url`: its users-svc (`http://HOST:PORT` or `https://HOST:PORT`),
    /// for `replay-cost`.
    #[arg(long, global = true)]
    pub users_url: Option<String>,
    /// With `--users-url`: the bearer token that users-svc asks for, as the relay's.
    #[arg(long, env = "USERS_AUTH_TOKEN", hide_env_values = true, global = true)]
    pub users_auth_token: Option<String>,
    /// With `https://` service URLs: the CA certificate (PEM) their certificates are
    /// checked against, as the relay's `--users-ca`; without it, the system's roots.
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// With `--student-url`: its Users DB, for `open`'s two stages.
    #[arg(long, global = true)]
    pub users_database_url: Option<String>,
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Debug, Subcommand)]
pub enum Mode {
    /// N CreateStudents with C in flight (closed loop), optionally with relays delivering.
    Closed {
        #[arg(long, default_value_t = 4000)]
        students: usize,
        #[arg(long, default_value_t = 32)]
        in_flight: usize,
        #[arg(long, default_value_t = 1)]
        relays: usize,
        /// `outbox` or `direct` (student-svc --link-mode).
        #[arg(long, default_value = "outbox")]
        link_mode: String,
    },
    /// CreateStudents at a fixed rate for a while (open loop), one relay delivering.
    Open {
        #[arg(long)]
        rate: f64,
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        duration: Duration,
    },
    /// A backlog written with no relay running, then drained by K relays started together.
    Drain {
        #[arg(long, default_value_t = 4000)]
        students: usize,
        #[arg(long, default_value_t = 1)]
        relays: usize,
    },
    /// The outbox flow and the direct (naive) flow at the same concurrency, in one run: at
    /// each of a list of concurrencies (`--in-flight 1,4,32`), outbox then direct.
    Compare {
        #[arg(long, default_value_t = 4000)]
        students: usize,
        #[arg(long, value_delimiter = ',', default_value = "4,32")]
        in_flight: Vec<usize>,
    },
    /// What the database alone does with the system's own transactions.
    Ceiling {
        /// Concurrent clients for CreateStudent's transaction.
        #[arg(long, default_value_t = 32)]
        create_clients: usize,
        /// Concurrent clients for each of the Users and link transactions.
        #[arg(long, default_value_t = 8)]
        drain_clients: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// What one claim costs with a long `done` history, with the claim's index and without.
    ClaimCost {
        #[arg(long, default_value_t = 1_000_000)]
        done: u64,
        #[arg(long, default_value_t = 10_000)]
        pending: u64,
        #[arg(long, default_value_t = 200)]
        claims: usize,
    },
    /// A repeat answered from the inbox next to a fresh CreateUser, one at a time.
    ReplayCost {
        #[arg(long, default_value_t = 1000)]
        calls: usize,
    },
    /// Everything issue 10's targets need, in one run, as ratios to the ceiling.
    Suite {
        /// Rows in each backlog drained, and CreateStudents in each closed-loop run (half
        /// that in each comparison). Enough for several seconds each: with a few thousand a
        /// fast machine measures mostly the processes' first second.
        #[arg(long, default_value_t = 20_000)]
        backlog: usize,
        /// Seconds of each open-loop run and of each ceiling measurement.
        #[arg(long, default_value_t = 15)]
        seconds: u64,
    },
    /// Judges kept `suite --json` files against issue 10's targets and prints one
    /// Markdown table each (the tables atop BENCHMARKS.md); starts nothing.
    Targets {
        #[arg(required_unless_present = "update")]
        files: Vec<PathBuf>,
        /// Instead, print again every table this Markdown file marks
        /// (`<!-- loadgen targets FILE -->` … `<!-- end loadgen targets -->`), in place.
        #[arg(long, conflicts_with = "files")]
        update: Option<PathBuf>,
    },
}

/// What `--json` writes: the run's results with where and how they were measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report<T> {
    pub backend: String,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub machine: Machine,
    pub results: T,
}

/// What the machine was, as `suite` writes it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    #[serde(default)]
    pub cpu: String,
    #[serde(default)]
    pub cpus: usize,
    #[serde(default)]
    pub measured_at: String,
}

/// The ceilings of one run: the library one, and on PostgreSQL pgbench's too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ceilings {
    pub library: Ceiling,
    pub pgbench: Option<Ceiling>,
}

impl Ceilings {
    /// The one results are compared with: pgbench's on PostgreSQL (the database with
    /// nothing of ours in front), the library one on SQLite.
    pub fn reference(&self) -> &Ceiling {
        self.pgbench.as_ref().unwrap_or(&self.library)
    }
}

/// Everything one `suite` run measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct SuiteResults {
    pub ceiling: Ceilings,
    pub create_alone: runs::ClosedRun,
    pub drain: Vec<runs::DrainRun>,
    pub full_load: runs::ClosedRun,
    pub open: Vec<runs::OpenRun>,
    pub compare: Vec<Comparison>,
    /// Runs older than the suite's replay phase have none.
    #[serde(default)]
    pub replay_cost: Option<ReplayCost>,
}

impl SuiteResults {
    /// Every process of every run, for their peak memory.
    pub fn processes(&self) -> impl Iterator<Item = &ProcessCost> {
        let closed = [&self.create_alone, &self.full_load]
            .into_iter()
            .chain(
                self.compare
                    .iter()
                    .flat_map(|comparison| [&comparison.outbox, &comparison.direct]),
            )
            .flat_map(|run| &run.processes);
        closed
            .chain(self.drain.iter().flat_map(|run| &run.processes))
            .chain(self.open.iter().flat_map(|run| &run.processes))
    }
}

/// Runs the chosen mode, printing as it goes; returns everything as JSON.
pub async fn execute(cli: &Cli) -> anyhow::Result<Value> {
    // Reads kept files only: no backend, nothing started.
    if let Mode::Targets { files, update } = &cli.mode {
        targets(files, update.as_deref())?;
        return Ok(Value::Null);
    }
    let backend = match (&cli.student_url, cli.backend.as_str()) {
        (Some(student_url), _) => {
            let measures_a_running_system = matches!(
                cli.mode,
                Mode::Closed { .. } | Mode::Open { .. } | Mode::ReplayCost { .. }
            );
            anyhow::ensure!(
                measures_a_running_system,
                "with --student-url only closed, open and replay-cost run: the other modes \
                 start their own binaries or make their own databases"
            );
            Backend::Running(Box::new(Running::from_urls(
                student_url,
                cli.student_database_url.as_deref(),
                cli.users_url.as_deref(),
                cli.users_database_url.as_deref(),
                cli.users_auth_token.as_deref(),
                cli.tls_ca.as_deref(),
            )?))
        }
        (None, "sqlite") => Backend::Sqlite,
        (None, url) => Backend::Postgres {
            admin_url: url.to_owned(),
        },
    };
    let env: Vec<(String, String)> = cli
        .env
        .iter()
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let backend_name = match &backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres { .. } => "postgres",
        Backend::Running(_) => "running",
    };
    println!("backend: {backend_name}; env: {:?}", cli.env);
    let results = match &cli.mode {
        Mode::Closed {
            students,
            in_flight,
            relays,
            link_mode,
        } => {
            let run =
                runs::closed(&backend, &env, link_mode, *relays, *students, *in_flight).await?;
            print_closed("closed", &run);
            json!({ "closed": run })
        }
        Mode::Open { rate, duration } => {
            let run = runs::open(&backend, &env, *rate, *duration).await?;
            print_open(&run);
            json!({ "open": run })
        }
        Mode::Drain { students, relays } => {
            let run = runs::drain(&backend, &env, *students, *relays).await?;
            print_drain(&run, None);
            json!({ "drain": run })
        }
        Mode::Compare {
            students,
            in_flight,
        } => {
            json!({ "compare": compare(&backend, &env, *students, in_flight).await? })
        }
        Mode::Ceiling {
            create_clients,
            drain_clients,
            seconds,
        } => {
            let ceilings = ceilings(&backend, *create_clients, *drain_clients, *seconds).await?;
            json!({ "ceiling": ceilings })
        }
        Mode::ClaimCost {
            done,
            pending,
            claims,
        } => {
            let cost = crate::claim_cost::measure(&backend, *done, *pending, *claims).await?;
            println!(
                "claim of 64 among {} due rows after {} done rows: right after they arrived, \
                 statistics from before them {}; with the index {}; without {}",
                cost.pending_rows,
                cost.done_rows,
                cost.after_quiet_spell,
                cost.with_index,
                cost.without_index
            );
            json!({ "claim_cost": cost })
        }
        Mode::ReplayCost { calls } => {
            let cost = crate::replay_cost::measure(&backend, &env, *calls).await?;
            print_replay(&cost);
            json!({ "replay_cost": cost })
        }
        Mode::Suite { backlog, seconds } => {
            serde_json::to_value(suite(&backend, &env, *backlog, *seconds).await?)?
        }
        // Answered above: it reads files and starts nothing.
        Mode::Targets { .. } => return Ok(Value::Null),
    };
    Ok(serde_json::to_value(Report {
        backend: backend_name.to_owned(),
        env: cli.env.clone(),
        machine: machine(),
        results,
    })?)
}

/// Prints the targets table of each kept file, or prints again those `document` marks.
fn targets(files: &[PathBuf], document: Option<&Path>) -> anyhow::Result<()> {
    let Some(document) = document else {
        for file in files {
            let report = crate::targets::load(file)?;
            println!(
                "{}",
                crate::targets::markdown(&file.display().to_string(), &report)
            );
        }
        return Ok(());
    };
    let text = std::fs::read_to_string(document)
        .with_context(|| format!("cannot read {}", document.display()))?;
    let root = document.parent().unwrap_or(Path::new("."));
    let regenerated = crate::targets::regenerate(&text, root)?;
    if regenerated != text {
        std::fs::write(document, regenerated)?;
        println!("updated the tables in {}", document.display());
    } else {
        println!("the tables in {} are up to date", document.display());
    }
    Ok(())
}

/// The ceilings of `backend`: the library one, and on PostgreSQL pgbench's too.
async fn ceilings(
    backend: &Backend,
    create_clients: usize,
    drain_clients: usize,
    seconds: u64,
) -> anyhow::Result<Ceilings> {
    let library = ceiling::library(backend, create_clients, drain_clients, seconds).await?;
    print_ceiling(
        "ceiling (the project's transaction functions, no gRPC)",
        &library,
    );
    let pgbench = match backend {
        Backend::Postgres { admin_url } => {
            let pgbench =
                ceiling::pgbench(admin_url, create_clients, drain_clients, seconds).await?;
            print_ceiling("ceiling (pgbench, bench/pgbench/*.sql)", &pgbench);
            if let Some(notifying) = pgbench.create_notify_in_transaction_per_second {
                println!("  create with the NOTIFY inside the transaction: {notifying:.0} tx/s");
            }
            Some(pgbench)
        }
        Backend::Sqlite | Backend::Running(_) => None,
    };
    Ok(Ceilings { library, pgbench })
}

/// The outbox flow beside the direct one at one concurrency.
#[derive(Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub in_flight: usize,
    pub outbox: runs::ClosedRun,
    pub direct: runs::ClosedRun,
    /// Students the outbox flow linked per second ÷ CreateStudents direct completed per
    /// second (a direct CreateStudent is linked when it returns).
    pub linked_ratio: f64,
    /// CreateStudent p50, outbox ÷ direct.
    pub p50_ratio: f64,
}

impl Comparison {
    /// The two runs at `in_flight` and their ratios.
    fn new(in_flight: usize, outbox: runs::ClosedRun, direct: runs::ClosedRun) -> Self {
        let linked = outbox.links.as_ref().map_or(0.0, |links| links.per_second);
        Self {
            in_flight,
            linked_ratio: ratio(linked, direct.create.per_second),
            p50_ratio: ratio(outbox.create.latency.p50_ms, direct.create.latency.p50_ms),
            outbox,
            direct,
        }
    }
}

/// The most the system sustains end to end in `full` (CreateStudent with a relay): the
/// lower of its CreateStudent rate and its linked rate. The open-loop runs take their
/// rates as fractions of it.
fn maximum(full: &runs::ClosedRun) -> f64 {
    full.links.as_ref().map_or(full.create.per_second, |links| {
        links.per_second.min(full.create.per_second)
    })
}

/// Outbox, then direct, at each concurrency of `in_flight`, `students` CreateStudents each.
async fn compare(
    backend: &Backend,
    env: &[(String, String)],
    students: usize,
    in_flight: &[usize],
) -> anyhow::Result<Vec<Comparison>> {
    let mut comparisons = Vec::new();
    for &in_flight in in_flight {
        let outbox = runs::closed(backend, env, "outbox", 1, students, in_flight).await?;
        print_closed(&format!("outbox, {in_flight} in flight"), &outbox);
        let direct = runs::closed(backend, env, "direct", 0, students, in_flight).await?;
        print_closed(&format!("direct, {in_flight} in flight"), &direct);
        let comparison = Comparison::new(in_flight, outbox, direct);
        println!(
            "  {in_flight} in flight: outbox linked/s ÷ direct completed/s = {:.2}; \
             CreateStudent p50 outbox ÷ direct = {:.2}",
            comparison.linked_ratio, comparison.p50_ratio
        );
        comparisons.push(comparison);
    }
    Ok(comparisons)
}

async fn suite(
    backend: &Backend,
    env: &[(String, String)],
    backlog: usize,
    seconds: u64,
) -> anyhow::Result<SuiteResults> {
    let ceilings = ceilings(backend, 32, 8, seconds).await?;
    let reference = ceilings.reference().clone();

    let create_only = runs::closed(backend, env, "outbox", 0, backlog, 32).await?;
    print_closed("CreateStudent alone, 32 in flight", &create_only);
    println!(
        "  ratio to the ceiling: {:.2}",
        ratio(create_only.create.per_second, reference.create_per_second)
    );

    let mut drains = Vec::new();
    for relays in [1, 2, 4] {
        let run = runs::drain(backend, env, backlog, relays).await?;
        print_drain(&run, Some(reference.drain_per_second));
        drains.push(run);
    }
    println!(
        "  2 relays ÷ 1 relay = {:.2}; 4 relays ÷ 1 relay = {:.2}",
        ratio(drains[1].links.per_second, drains[0].links.per_second),
        ratio(drains[2].links.per_second, drains[0].links.per_second)
    );

    let full = runs::closed(backend, env, "outbox", 1, backlog, 32).await?;
    print_closed("full load, 32 in flight, 1 relay", &full);
    let maximum = maximum(&full);
    let mut opens = Vec::new();
    for fraction in [0.25, 0.5] {
        let run = runs::open(
            backend,
            env,
            maximum * fraction,
            Duration::from_secs(seconds),
        )
        .await?;
        print!("  at {fraction} of the maximum: ");
        print_open(&run);
        opens.push(run);
    }
    let comparisons = compare(backend, env, backlog / 2, &[4, 32]).await?;
    let replay = crate::replay_cost::measure(backend, env, REPLAY_CALLS).await?;
    print_replay(&replay);
    Ok(SuiteResults {
        ceiling: ceilings,
        create_alone: create_only,
        drain: drains,
        full_load: full,
        open: opens,
        compare: comparisons,
        replay_cost: Some(replay),
    })
}

/// CreateUsers timed one at a time, fresh and then replayed, in a suite.
const REPLAY_CALLS: usize = 1000;

fn print_replay(cost: &ReplayCost) {
    println!(
        "CreateUser fresh {}; replayed from the inbox {}; replay ÷ fresh (p50) = {:.2}; \
         a call with no database behind it (health check) {}",
        cost.fresh, cost.replay, cost.ratio, cost.call_floor
    );
}

fn print_closed(label: &str, run: &runs::ClosedRun) {
    println!(
        "{label}: {} CreateStudent in {:.2} s = {:.0}/s ({} errors), {}",
        run.create.calls,
        run.create.seconds,
        run.create.per_second,
        run.create.errors,
        run.create.latency
    );
    if let Some(mean) = run.students_per_commit {
        println!("  {mean:.1} students per CreateStudent transaction (group commit)");
    }
    if let Some(links) = &run.links {
        println!(
            "  linked {:.0}/s; link latency {}",
            links.per_second, links.latency
        );
    }
    print_costs(&run.processes);
}

fn print_open(run: &runs::OpenRun) {
    println!(
        "open loop {:.0}/s for {:.0} s: CreateStudent {}; link latency {}",
        run.rate, run.seconds, run.create.latency, run.links.latency
    );
    println!("  {}", run.stages);
}

fn print_drain(run: &runs::DrainRun, ceiling: Option<f64>) {
    print!(
        "drain of {} rows by {} relay(s): {:.0}/s",
        run.backlog, run.relays, run.links.per_second
    );
    match ceiling {
        Some(ceiling) => println!(
            " = {:.2} of the ceiling",
            ratio(run.links.per_second, ceiling)
        ),
        None => println!(),
    }
    print_costs(&run.processes);
}

fn print_ceiling(label: &str, ceiling: &Ceiling) {
    println!(
        "{label}: create {:.0} tx/s; users {:.0} rows/s ({} a transaction) and link {:.0} rows/s together, drain {:.0}/s; CreateUser alone, one row a transaction, {:.0}/s",
        ceiling.create_per_second,
        ceiling.users_per_second,
        crate::ceiling::USERS_PER_CALL,
        ceiling.link_per_second,
        ceiling.drain_per_second,
        ceiling.create_user_alone_per_second.unwrap_or(f64::NAN)
    );
}

fn print_costs(costs: &[ProcessCost]) {
    let line: Vec<String> = costs
        .iter()
        .map(|cost| {
            format!(
                "{} {:.1} s CPU, {:.0} MB peak",
                cost.name, cost.cpu_seconds, cost.peak_rss_mb
            )
        })
        .collect();
    if !line.is_empty() {
        println!("  {}", line.join("; "));
    }
}

/// What the numbers were measured on.
fn machine() -> Machine {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    Machine {
        cpus,
        cpu: model,
        measured_at: platform::db::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load::Calls, rows::Links, stats::Latency};

    fn run(create_per_second: f64, p50_ms: f64, linked_per_second: Option<f64>) -> runs::ClosedRun {
        runs::ClosedRun {
            link_mode: "outbox".into(),
            relays: 1,
            in_flight: 4,
            create: Calls {
                calls: 100,
                errors: 0,
                seconds: 1.0,
                per_second: create_per_second,
                latency: Latency {
                    p50_ms,
                    ..Latency::default()
                },
            },
            students_per_commit: None,
            links: linked_per_second.map(|per_second| Links {
                rows: 100,
                latency: Latency::default(),
                per_second,
            }),
            processes: Vec::new(),
        }
    }

    /// BENCHMARKS' targets: outbox linked/s ÷ direct completed/s, and CreateStudent p50
    /// outbox ÷ direct.
    #[test]
    fn a_comparison_divides_the_outbox_flow_by_the_direct_one() {
        let outbox = run(400.0, 2.0, Some(300.0));
        let direct = run(200.0, 8.0, None);
        let comparison = Comparison::new(4, outbox, direct);
        assert_eq!((comparison.linked_ratio, comparison.p50_ratio), (1.5, 0.25));
    }

    /// The open loops run at fractions of what the system sustains end to end.
    #[test]
    fn the_maximum_is_the_slower_of_creating_and_linking() {
        assert_eq!(maximum(&run(1000.0, 1.0, Some(600.0))), 600.0);
        assert_eq!(maximum(&run(500.0, 1.0, Some(600.0))), 500.0);
        assert_eq!(maximum(&run(1000.0, 1.0, None)), 1000.0);
    }
}
